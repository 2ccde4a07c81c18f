"""Persistence shared by the API and the worker: models, repositories, migrations check, artifact files."""
