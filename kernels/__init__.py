"""Pure numerical kernels: NumPy everywhere, CuPy on a GPU. No web, database or Celery imports here."""
