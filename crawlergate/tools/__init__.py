"""The offline tools: read access logs, replay them, analyse them, simulate cache policies."""
