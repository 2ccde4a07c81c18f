"""Structured logs (structlog): JSON lines when not on a terminal, readable key=value on one.

The Celery worker uses :func:`configure_worker_logging` instead: Celery owns its process's output (it
redirects stdout and stderr to a logger at WARNING), so there structlog hands each line to stdlib logging
at its own level and Celery's handler formats it like every other worker line.
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


def configure_logging(level: int = logging.INFO) -> None:
    global _configured
    if _configured:
        return
    # The console renderer prints exceptions itself; JSON lines need them rendered into a field.
    renderers: list[structlog.typing.Processor] = (
        [structlog.dev.ConsoleRenderer()] if sys.stderr.isatty()
        else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: tests (structlog.testing.capture_logs) and reconfiguration must reach every logger.
        cache_logger_on_first_use=False,
    )
    _configured = True


def configure_worker_logging(level: int = logging.INFO) -> None:
    """structlog through stdlib logging: the level reaches Celery's handler, which adds time and level."""
    global _configured
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Each call ends as logger.<level>(line) on the stdlib logger of the structlog logger's name.
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    _configured = True
