"""Text that came from someone else (job names, commands, reasons, app ids, error messages) printed literally.

Rich reads `[bold]...[/]` in a plain string as markup and `:smile:` as an emoji, and a terminal obeys escape
sequences: a job name could crash root's `corral ps --all` (`[/bold]` closes nothing), restyle its table, or move the
cursor and rewrite what another user sees. So every view prints such text through `literal`:

    literal("[/bold]\x1b[2J")  ->  Text("[/bold]\\x1b[2J")      markup as is, control characters escaped

A `Text` is never parsed for markup or emoji, and the escapes are those of Python's `repr` (`\\x1b`, `\\n`, `\\u202e`,
and `\\ud800` for a lone surrogate, which no terminal encoding can write).
"""

from __future__ import annotations

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


def literal(value: object, style: str = "", *, lines: bool = False) -> Text:
    """A table cell or a piece of a line (`lines`: a block of lines): `value` escaped, never read as markup."""
    return Text(escaped(value, lines=lines), style=style)


def say(console: Console, *parts: object) -> None:
    """Print one line made of `parts`: a `Text` is kept (corral's own styling), anything else goes through `literal`."""
    console.print(Text.assemble(*(p if isinstance(p, Text) else literal(p) for p in parts)), soft_wrap=True)


def error_line(console: Console, message: object) -> None:
    """`error: MESSAGE`, the message literal (it often quotes what the user or another user typed)."""
    say(console, Text("error:", style="bold red"), " ", message)


def row(table: Table, *cells: object) -> None:
    """`table.add_row` with every cell literal."""
    table.add_row(*(c if isinstance(c, Text) else literal(c) for c in cells))
