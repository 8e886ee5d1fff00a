"""Observability: Prometheus metrics, OpenTelemetry spans, structured logs."""
