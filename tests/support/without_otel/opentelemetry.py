"""Stands in for an install without the `otel` extra: on PYTHONPATH, this plain module hides the
installed OpenTelemetry packages (`opentelemetry.sdk` cannot be found under a module that is not a package)."""
