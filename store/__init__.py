"""Persistence shared by the API and the worker: settings, models, repositories, artifact files."""
