"""`NinferApp`: the Textual chat. Wires the prompt, chat log, perf panel, history sidebar and
status line to an `EngineClient`, a `HistoryStore` and the slash commands.

It sees only typed events and value objects; which engine runs (in-process or a server)
is decided by whoever builds the client (`ninfer_nb.tui.__main__`).
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from . import commands as cmd
from .client import ClientError, EngineClient
from .conversation import Conversation, Message, title_from
from .events import ModelInfo, TokenTick
from .palette import ChatCommands
from .screens.help import HelpScreen
from .settings import ChatSettings, TuiConfig
from .slash import SlashCommandsMixin
from .store import HistoryStore
from .streaming import stream_turn
from .sysmon import SystemProbe
from .turn import Turn
from .widgets.chat_log import ChatLog
from .widgets.history import HistoryList
from .widgets.perf import PerfPanel
from .widgets.prompt import PromptArea
from .widgets.status import StatusLine


class NinferApp(SlashCommandsMixin):
    """Chat with a ninfer_nb model and watch the engine while it answers."""

    TITLE = "ninfer-tui"
    CSS_PATH = "app.tcss"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("f2", "toggle_perf", "Monitor"),
        Binding("ctrl+b", "toggle_history", "History"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("f1", "help", "Help"),
    ]
    KEY_HELP: list[tuple[str, str]] = [
        ("Enter", "send the message"),
        ("Shift+Enter / Ctrl+J", "new line in the message"),
        ("Esc", "stop the answer being generated"),
        ("F2", "show / hide the engine monitor"),
        ("Ctrl+B", "show / hide saved conversations (Enter opens, d deletes)"),
        ("Ctrl+N", "new conversation"),
        ("Ctrl+P", "command palette"),
        ("? / F1", "this help (? on an empty prompt)"),
        ("Tab / Shift+Tab", "move focus"),
        ("Ctrl+Q", "quit"),
    ]

    def __init__(self, config: TuiConfig, client: EngineClient) -> None:
        super().__init__()
        self.config = config
        self.client = client
        self.settings: ChatSettings = config.chat
        self.conversation = Conversation()
        self.store = HistoryStore(config.data_dir)
        self.info: ModelInfo | None = None
        self.turn: Turn | None = None
        self.state = "connecting…" if client.remote else "loading model…"
        self._probe: SystemProbe | None = None

    # --- layout & lifecycle ------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield HistoryList(id="history")
            with Vertical(id="main"):
                yield ChatLog(id="chat")
                yield PromptArea(id="prompt", cursor_blink=self.config.cursor_blink)
            yield PerfPanel(id="perf")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.screen.set_class(self.config.show_perf, "-show-perf")
        self.screen.set_class(self.config.show_history, "-show-history")
        self.query_one(PerfPanel).view.max_context = self.config.max_context
        self.query_one(PerfPanel).show()
        self._refresh_history()
        self._refresh_status()
        self.query_one(PromptArea).focus()
        self._connect()
        if self.config.perf_interval_s > 0:
            self.set_interval(self.config.perf_interval_s, self._poll_stats)

    async def on_unmount(self) -> None:
        if self.turn is not None:
            self.turn.cancel()
        finishing = [w for w in self.workers if w.group == "turn"]
        if finishing:                    # let a cancelled turn store its partial answer first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.workers.wait_for_complete(finishing), 5.0)
        if self._probe is not None:
            self._probe.close()
        await self.client.close()
        self.store.close()

    @work(group="connect", exclusive=True)
    async def _connect(self) -> None:
        await self._ensure_started()

    async def _ensure_started(self) -> bool:
        if self.info is not None:
            return True
        try:
            self.info = await self.client.start()
        except ClientError as exc:
            self.state = "offline" if self.client.remote else "error: no model"
            self._refresh_status()
            await self.query_one(ChatLog).add_note(exc.message, error=True)
            return False
        self._probe = self.client.system_probe()
        self.state = "ready"
        i = self.info
        where = f" on {i.device}" if i.device else ""
        ctx = f" · context {i.max_context}" if i.max_context else ""
        await self.query_one(ChatLog).add_note(
            f"{Path(i.model_id).name} ready{where}{ctx} · /help lists commands"
        )
        panel = self.query_one(PerfPanel)
        panel.view.info = self.info
        panel.show()
        self._refresh_status()
        return True

    # --- status & perf -----------------------------------------------------------------
    def _refresh_status(self) -> None:
        model = Path(self.info.model_id).name if self.info else self.client.description
        self.query_one(StatusLine).set_status(model, self.settings.status(), self.state)

    async def _poll_stats(self) -> None:
        """Timer and end-of-turn refresh of the perf panel (a no-op while the app quits)."""
        if self.info is None or self._shutting_down() or not self.screen.has_class("-show-perf"):
            return
        stats = await self.client.stats()
        if self._shutting_down():
            return
        panel = self.query_one(PerfPanel)
        panel.view.engine = stats
        if self._probe is not None:
            panel.view.system = self._probe.sample()
        panel.show()

    def _on_tick(self, tick: TokenTick) -> None:
        if self._shutting_down():
            return
        panel = self.query_one(PerfPanel)
        panel.view.live_tok_s = tick.tok_s
        if tick.tok_s > 0:
            panel.view.history.append(tick.tok_s)
        panel.show()

    # --- chatting ------------------------------------------------------------------------
    @on(PromptArea.Submitted)
    async def _submitted(self, event: PromptArea.Submitted) -> None:
        text = event.text
        if cmd.is_command(text):
            event.prompt.clear()
            self.run_slash(text)
            return
        if text.startswith("//"):
            text = text[1:]
        if self.turn is not None and self.turn.active:
            self.notify("Still answering — press Esc to stop it first.", severity="warning")
            return
        event.prompt.clear()
        await self.query_one(ChatLog).add_user(text)
        self.conversation.messages.append(Message("user", text))
        if len(self.conversation.messages) == 1:
            self.conversation.title = title_from(text)
        self._run_turn(text)

    @work(group="turn", exclusive=True)
    async def _run_turn(self, text: str) -> None:
        log = self.query_one(ChatLog)
        if not await self._ensure_started():
            self._drop_failed_turn(text)
            return
        widget = await log.add_assistant()
        panel = self.query_one(PerfPanel)
        panel.view.generating, panel.view.live_tok_s = True, None
        panel.view.history.clear()
        messages = self.conversation.api_messages(self.settings.system)
        self.turn = self.client.chat(messages, self.settings)
        self.state = "generating… (Esc to stop)"
        self._refresh_status()
        self.refresh_bindings()   # show "Stop" in the footer
        outcome = await stream_turn(self.turn, widget, self._on_tick)
        self.turn = None
        if outcome.message is not None:
            self.conversation.messages.append(outcome.message)
        if self._shutting_down():        # quit mid-answer: keep what came, touch no widget
            if outcome.message is not None:
                self._store_conversation()
            return
        self.refresh_bindings()
        panel.view.generating = False
        if outcome.timings is not None:
            panel.view.last = outcome.timings
        panel.show()
        if outcome.message is None:
            self._drop_failed_turn(text)
        self.state = f"error: {outcome.error}" if outcome.error else "ready"
        self._save()
        self._refresh_status()
        await self._poll_stats()

    def _drop_failed_turn(self, text: str) -> None:
        """Nothing came back: take the prompt out of the context and give it back to edit."""
        msgs = self.conversation.messages
        if msgs and msgs[-1].role == "user":
            msgs.pop()
        users = self.query_one(ChatLog).query("UserMessage")
        if users:
            users.last().add_class("not-sent")
        prompt = self.query_one(PromptArea)
        if not prompt.text:
            prompt.load_text(text)

    def _shutting_down(self) -> bool:
        """The app is exiting: its widgets are already gone (a turn may still be finishing)."""
        return not self.query(StatusLine)

    def _store_conversation(self) -> None:
        if self.conversation.messages:
            self.store.save(self.conversation, self.info.model_id if self.info else "")

    def _save(self) -> None:
        if self.conversation.messages:
            self._store_conversation()
            self._refresh_history()

    def _refresh_history(self) -> None:
        self.query_one(HistoryList).set_items(self.store.list(), self.conversation.id)

    # --- actions -----------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.turn is not None and self.turn.active
        return True

    def action_stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel()

    def action_toggle_perf(self) -> None:
        self.screen.toggle_class("-show-perf")
        if self.screen.has_class("-show-perf"):
            self.run_worker(self._poll_stats(), group="poll")

    def action_toggle_history(self) -> None:
        self.screen.toggle_class("-show-history")
        if self.screen.has_class("-show-history"):
            self.query_one(HistoryList).focus()
        else:
            self.query_one(PromptArea).focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.KEY_HELP))

    async def action_new_chat(self) -> None:
        await self._open(Conversation())

    async def _open(self, conv: Conversation) -> None:
        if self.turn is not None:
            self.turn.cancel()
            self.workers.cancel_group(self, "turn")
            self.turn = None
        self.conversation = conv
        await self.query_one(ChatLog).show(conv)
        self._refresh_history()
        self.state = "ready" if self.info else self.state
        self._refresh_status()

    @on(HistoryList.Open)
    async def _open_saved(self, event: HistoryList.Open) -> None:
        conv = self.store.load(event.conversation_id)
        if conv is not None:
            await self._open(conv)
            self.query_one(PromptArea).focus()

    @on(HistoryList.Delete)
    async def _delete_saved(self, event: HistoryList.Delete) -> None:
        self.store.delete(event.conversation_id)
        if self.conversation.id == event.conversation_id:
            await self._open(Conversation())
        self._refresh_history()
