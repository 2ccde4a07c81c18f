"""The API's routers: jobs, datasets, health and metrics."""
