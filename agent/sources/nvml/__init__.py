"""sources/nvml."""
