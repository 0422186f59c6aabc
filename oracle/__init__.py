"""The official semantics, instrumented. Never imports `engine`."""
