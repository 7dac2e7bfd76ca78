"""ninfer-tui: a Textual chat for ninfer_nb with a live view of what the engine is doing.

The app talks to an `EngineClient` (in-process engine or a running `ninfer-serve`) and only
ever sees typed events from `tui.events`. Nothing here knows how tokens are computed.
"""
