"""Textual widgets of ninfer-tui: prompt, chat messages, perf panel, history, status line."""
