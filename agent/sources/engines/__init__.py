"""sources/engines."""
