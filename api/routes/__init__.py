"""The API's routers, one module per resource; api.app.ROUTERS lists the ones the app serves."""
