"""Text that came from someone else (job names, commands, reasons, app ids, error messages) printed literally, and
cheaply.

Rich reads `[bold]...[/]` in a plain string as markup and `:smile:` as an emoji, and a terminal obeys escape
sequences: a job name could crash root's `corral ps --all` (`[/bold]` closes nothing), restyle its table, or move the
cursor and rewrite what another user sees. So every view prints such text through `literal` (a table cell) or `say`
(a line):

    literal("[/bold]\x1b[2J")  ->  Text("[/bold]\\x1b[2J")      markup as is, control characters escaped

A `Text` is never parsed for markup or emoji, and the escapes are those of Python's `repr` (`\\x1b`, `\\n`, `\\u202e`,
and `\\ud800` for a lone surrogate, which no terminal encoding can write).

The thin client's commands must start in well under 150 ms, and importing Rich alone costs about 40 ms. So a line
(`say`, `error_line`) on a `Terminal` is written directly, with ANSI styles only on a colour terminal, and Rich is
imported only to draw a table (`table`, `Terminal.print`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escaped(value: object, *, lines: bool = False) -> str:
    """`value` as printable text: control, format and other unprintable characters as escapes; one line unless
    `lines` (then newlines are kept)."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " " or (lines and ch == "\n"):
            out.append(ch)
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


@dataclass(frozen=True)
class Styled:
    """corral's own words with a style (Rich's names: "bold red", "green"): printed as they are, never escaped."""

    text: str
    style: str = ""


def literal(value: object, style: str = "", *, lines: bool = False) -> Text:
    """A table cell or a piece of a line (`lines`: a block of lines): `value` escaped, never read as markup."""
    from rich.text import Text

    return Text(escaped(value, lines=lines), style=style)


#: SGR codes of the style words corral's own lines use; a word not here is printed without style.
_SGR = {
    "bold": "1", "dim": "2", "italic": "3", "underline": "4", "reverse": "7",
    "black": "30", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35", "cyan": "36",
    "white": "37",
}  # fmt: skip


class Terminal:
    """stdout (or stderr): lines written directly, tables through a Rich `Console` made on first use.

    The stream is looked up at each write, not kept, so that a test runner's captured stdout is the one written to.
    Colour as Rich decides it: only on a terminal, never with NO_COLOR or TERM=dumb, always with FORCE_COLOR."""

    def __init__(self, *, stderr: bool = False, soft_wrap: bool = False) -> None:
        self.stderr = stderr
        self.soft_wrap = soft_wrap
        self._console: Console | None = None

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self.stderr else sys.stdout

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self.stderr, soft_wrap=self.soft_wrap)
        return self._console

    def color(self) -> bool:
        if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
            return False
        if os.environ.get("FORCE_COLOR"):
            return True
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def print(self, renderable: Any, **kwargs: Any) -> None:
        """Rich's `Console.print` (a table, or corral's own markup)."""
        self.console.print(renderable, **kwargs)

    def write_line(self, parts: tuple[object, ...]) -> None:
        color = self.color()
        pieces = []
        for part in parts:
            text, style = _text_and_style(part)
            codes = [_SGR[w] for w in style.split() if w in _SGR] if color else []
            pieces.append(f"\x1b[{';'.join(codes)}m{text}\x1b[0m" if codes else text)
        stream = self.stream
        stream.write("".join(pieces) + "\n")
        stream.flush()


def _text_and_style(part: object) -> tuple[str, str]:
    if isinstance(part, Styled):
        return part.text, part.style
    rich_text = sys.modules.get("rich.text")  # a rich Text exists only once rich.text is imported
    if rich_text is not None and isinstance(part, rich_text.Text):
        return part.plain, str(part.style)
    return escaped(part), ""


def say(console: Console | Terminal, *parts: object) -> None:
    """Print one line made of `parts`: a `Styled` (or a Rich `Text`) is corral's own and kept, anything else goes
    through `literal`."""
    if isinstance(console, Terminal):
        console.write_line(parts)
        return
    from rich.text import Text

    pieces = [
        Text(p.text, style=p.style) if isinstance(p, Styled) else p if isinstance(p, Text) else literal(p)
        for p in parts
    ]
    console.print(Text.assemble(*pieces), soft_wrap=True)


def error_line(console: Console | Terminal, message: object) -> None:
    """`error: MESSAGE`, the message literal (it often quotes what the user or another user typed)."""
    say(console, Styled("error:", "bold red"), " ", message)


def table(*headers: str, **kwargs: Any) -> Table:
    """A Rich table with these column headers (Rich is imported here, when a view draws one)."""
    from rich.table import Table

    return Table(*headers, **kwargs)


def row(table: Table, *cells: object) -> None:
    """`table.add_row` with every cell literal (a `Styled` cell: corral's own, with its style)."""
    from rich.text import Text

    table.add_row(
        *(
            c if isinstance(c, Text) else Text(c.text, style=c.style) if isinstance(c, Styled) else literal(c)
            for c in cells
        )
    )
