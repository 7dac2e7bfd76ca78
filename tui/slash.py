"""`SlashCommandsMixin`: applies parsed slash commands (typed or from the palette) to the
app: settings changes, /clear, /save, /model, panel toggles, /help.

Parsing lives in `tui.commands`; this module only decides what each command does. The
attributes and hooks it relies on are declared on the class and provided by `NinferApp`.
"""
from __future__ import annotations

from pathlib import Path

from textual.app import App

from . import commands as cmd
from .client import EngineClient
from .conversation import Conversation
from .events import ModelInfo
from .settings import ChatSettings, SettingError, TuiConfig
from .transcript import to_markdown
from .widgets.chat_log import ChatLog
from .widgets.prompt import PromptArea


class SlashCommandsMixin(App[None]):
    config: TuiConfig
    client: EngineClient
    settings: ChatSettings
    conversation: Conversation
    info: ModelInfo | None
    state: str

    # hooks NinferApp implements
    def _refresh_status(self) -> None: ...
    def _save(self) -> None: ...
    async def action_new_chat(self) -> None: ...
    def action_toggle_perf(self) -> None: ...
    def action_toggle_history(self) -> None: ...
    def action_help(self) -> None: ...

    # --- slash commands (also reached from the palette) -----------------------------------
    def prefill_prompt(self, text: str) -> None:
        prompt = self.query_one(PromptArea)
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    def run_slash(self, text: str) -> None:
        self.run_worker(self._apply(text), group="slash")

    async def _apply(self, text: str) -> None:
        log = self.query_one(ChatLog)
        try:
            c = cmd.parse(text)
            note = await self._apply_command(c)
        except SettingError as exc:
            await log.add_note(str(exc), error=True)
            return
        if note:
            await log.add_note(note)
        self._refresh_status()

    async def _apply_command(self, c: cmd.Command) -> str | None:
        s = self.settings
        if isinstance(c, cmd.SetSystem):
            self.settings = s.with_system(c.text)
            return "System prompt set." if c.text else "System prompt cleared."
        if isinstance(c, cmd.SetTemperature):
            self.settings = s.with_temperature(c.value)
            return f"temperature = {c.value:g}"
        if isinstance(c, cmd.SetTopP):
            self.settings = s.with_top_p(c.value)
            return f"top_p = {c.value:g}"
        if isinstance(c, cmd.SetMaxTokens):
            self.settings = s.with_max_tokens(c.value)
            return f"max_tokens = {c.value}"
        if isinstance(c, cmd.SetThinking):
            on_ = (not s.thinking) if c.on is None else c.on
            self.settings = s.with_thinking(on_)
            return f"thinking {'on' if on_ else 'off'}"
        if isinstance(c, cmd.Clear):
            await self.action_new_chat()
            return None
        if isinstance(c, cmd.Save):
            return self._save_transcript(c.path)
        if isinstance(c, cmd.ShowModel):
            return self._model_text()
        if isinstance(c, cmd.TogglePerf):
            self.action_toggle_perf()
        elif isinstance(c, cmd.ToggleHistory):
            self.action_toggle_history()
        elif isinstance(c, cmd.ShowHelp):
            self.action_help()
        return None

    def _save_transcript(self, path: str | None) -> str:
        if not self.conversation.messages:
            raise SettingError("nothing to save yet")
        self._save()
        if path:
            target = Path(path).expanduser()
        else:
            target = self.config.data_dir / "transcripts" / f"chat-{self.conversation.id}.md"
        model = self.info.model_id if self.info else ""
        text = to_markdown(self.conversation, model=model, system=self.settings.system)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise SettingError(f"could not save to {target}: {exc.strerror or exc}") from exc
        return f"Saved transcript to {target}"

    def _model_text(self) -> str:
        if self.info is None:
            return f"No model loaded ({self.client.description}); state: {self.state}"
        i = self.info
        rows = [("model", i.model_id), ("backend", i.backend), ("device", i.device or "—")]
        if i.max_context:
            rows.append(("max context", str(i.max_context)))
        rows += list(i.details)
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
