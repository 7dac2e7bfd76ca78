"""Modal screens of ninfer-tui."""
