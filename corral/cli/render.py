"""Text that came from someone else (job names, commands, reasons, app ids, error messages) printed literally, and
cheaply.

Rich reads `[bold]...[/]` in a plain string as markup and `:smile:` as an emoji, and a terminal obeys escape
sequences: a job name could crash root's `corral ps --all` (`[/bold]` closes nothing), restyle its table, or move the
cursor and rewrite what another user sees. So every view prints such text through `literal` (a table cell) or `say`
(a line):

    literal("[/bold]\x1b[2J")  ->  Text("[/bold]\\x1b[2J")      markup as is, control characters escaped

A `Text` is never parsed for markup or emoji, and the escapes are those of Python's `repr` (`\\x1b`, `\\n`, `\\u202e`,
and `\\ud800` for a lone surrogate, which no terminal encoding can write).

The thin client's commands must start in well under 150 ms, and importing Rich alone costs about 40 ms, drawing a
boxed table about 1 ms a row (a second for a page of 1,000 jobs). So a `Terminal` writes a line (`say`,
`error_line`) and a table (`table`: aligned columns, one line a row, like `kubectl get` or `squeue`) itself, with
ANSI styles only on a colour terminal; Rich is left to the commands that load the engine anyway (`corral place`).

    ID   NAME   USER   STATE     GPUS   COMMAND   REASON
    1           ann    running   0,1    sleep 9   -

Piped, a row is never cut (it greps); on a terminal it is cut to the terminal's width with "…" (`show` has it all).
"""

from __future__ import annotations

import os
import sys
import unicodedata
from itertools import repeat

TYPE_CHECKING = False  # typing's, without importing typing or dataclasses: `corral ps`'s fast path draws with this
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

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


class Styled:
    """corral's own words with a style (Rich's names: "bold red", "green"): printed as they are, never escaped.
    A value, as a frozen dataclass would be (written out: dataclasses costs several ms of `corral ps`'s start)."""

    __slots__ = ("style", "text")
    text: str
    style: str

    def __init__(self, text: str, style: str = "") -> None:
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "style", style)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is Styled and (self.text, self.style) == (other.text, other.style)

    def __hash__(self) -> int:
        return hash((self.text, self.style))

    def __repr__(self) -> str:
        return f"Styled(text={self.text!r}, style={self.style!r})"


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


def width(text: str) -> int:
    """Terminal cells `text` takes: East Asian wide characters two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def cut(text: str, cells: int) -> str:
    """`text` in at most `cells` terminal cells, its end replaced by "…" when it was longer."""
    if width(text) <= cells:
        return text
    kept, used = [], 0
    for ch in text:
        w = width(ch)
        if used + w > cells - 1:
            break
        kept.append(ch)
        used += w
    return "".join(kept) + "…"


class Columns:
    """A table drawn as aligned columns of plain text: a row is a line. Cells are shown literally (escaped), a
    `Styled` cell with its style on a colour terminal."""

    GAP = "   "

    def __init__(self, *headers: str) -> None:
        self.headers = headers
        #: the rows' cells as given: measured when drawn, a column at a time (a listing of 5,000 jobs is 45,000 cells)
        self.cells: list[tuple[object, ...]] = []
        #: or the cells as add_columns gave them, a list per column (until a row is added or asked for)
        self._columns: Sequence[Sequence[object]] | None = None

    def add_row(self, *cells: object) -> None:
        self._rows()
        self.cells.append(cells)

    def add_columns(self, *columns: Sequence[object]) -> None:
        """The rows' cells a column at a time, a list of cells per header (`corral ps`: no tuple a row is made to
        draw them piped); rows added after are added below them."""
        if len(columns) != len(self.headers) or len({len(c) for c in columns}) > 1:
            raise ValueError(f"{len(self.headers)} columns of as many cells each, got {[len(c) for c in columns]}")
        if self.cells or self._columns is not None:
            self._rows().extend(zip(*columns, strict=True))
        else:
            self._columns = columns  # kept as given: while set, `cells` is empty

    def _rows(self) -> list[tuple[object, ...]]:
        """`cells`, with columns given by add_columns made rows (once)."""
        if self._columns is not None:
            self.cells = [*zip(*self._columns, strict=True), *self.cells]
            self._columns = None
        return self.cells

    @property
    def rows(self) -> list[tuple[tuple[str, str, int], ...]]:
        """Per row, per cell: (text, style, terminal cells)."""
        return [tuple(_measured(c) for c in r) for r in self._rows()]

    def lines(self, *, color: bool, cells: int | None) -> list[str]:
        """The header and a line per row; each cut to `cells` terminal cells unless None."""
        if cells is None and not color and self._columns is not None:  # (cells is then empty)
            return self._plain(self._columns)
        if cells is None and not color and all(len(r) == len(self.headers) for r in self.cells):
            return self._plain(list(zip(*self.cells, strict=True)) or [() for _ in self.headers])
        grid = [tuple((h, "bold", width(h)) for h in self.headers), *self.rows]
        widths = [max(row[i][2] if i < len(row) else 0 for row in grid) for i in range(len(self.headers))]
        gap = self.GAP
        out = []
        for row in grid:
            last_i = len(row) - 1
            if cells is None and not color:  # piped, rows of a cell too few
                out.append(
                    gap.join(
                        t if i == last_i else t + " " * (widths[i] - w) for i, (t, _, w) in enumerate(row)
                    ).rstrip()
                )
                continue
            pieces, used = [], 0
            for i, (cell_text, style, cell_width) in enumerate(row):
                text = cell_text if i == last_i else cell_text + " " * (widths[i] - cell_width)
                text_width = cell_width if i == last_i else max(widths[i], cell_width)
                lead = "" if i == 0 else gap
                if cells is not None and used + len(lead) + text_width > cells:
                    room = cells - used - len(lead)
                    if room > 0:
                        pieces.append(lead + _paint(cut(text.rstrip(), room), style, color))
                    break
                pieces.append(lead + _paint(text, style, color))
                used += len(lead) + text_width
            out.append("".join(pieces).rstrip())
        return out

    def _plain(self, given: Sequence[Sequence[Any]]) -> list[str]:
        """Piped: no style, no cut, a row a line; the common case, drawn a column at a time (`given`, a list of cells
        per column): a column of plain ASCII strings (most of a listing's) is measured and padded by str's own loops
        (`corral ps` of 5,000 jobs: about a third of the time the same lines took cell by cell)."""
        last = len(self.headers) - 1
        columns: list[list[str]] = []
        for i, column in enumerate(given):
            header, header_width = self.headers[i], width(self.headers[i])
            if set(map(type, column)) <= {str} and (joined := "".join(column)).isascii() and joined.isprintable():
                texts: Sequence[str] = column  # all str, as just checked
                if i == last:
                    columns.append([header, *texts])
                    continue
                cells = max(header_width, max(map(len, texts), default=0))
                columns.append([header + " " * (cells - header_width), *map(str.ljust, texts, repeat(cells))])
                continue
            measured = [_measured(c) for c in column]
            if i == last:
                columns.append([header, *(t for t, _, _ in measured)])
                continue
            cells = max(header_width, max((w for _, _, w in measured), default=0))
            columns.append([header + " " * (cells - header_width), *(t + " " * (cells - w) for t, _, w in measured)])
        return [line.rstrip() for line in map(self.GAP.join, zip(*columns, strict=True))]


def _measured(cell: object) -> tuple[str, str, int]:
    if type(cell) is str and cell.isprintable():  # a plain str (a subclass's str() may differ): as it is
        return cell, "", len(cell) if cell.isascii() else width(cell)
    text, style = _text_and_style(cell)
    return text, style, width(text)


def _paint(text: str, style: str, color: bool) -> str:
    codes = [_SGR[w] for w in style.split() if w in _SGR] if color and text.strip() else []
    if not codes:
        return text
    stripped = text.rstrip()  # the padding stays unstyled (an underline would run on)
    return f"\x1b[{';'.join(codes)}m{stripped}\x1b[0m{text[len(stripped) :]}"


class Terminal:
    """stdout (or stderr): lines written directly, tables through a Rich `Console` made on first use.

    The stream is looked up at each write, not kept, so that a test runner's captured stdout is the one written to.
    Colour by the usual conventions: only on a terminal, never with NO_COLOR or TERM=dumb, always with FORCE_COLOR."""

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
        return self.isatty()

    def print(self, renderable: Any, **kwargs: Any) -> None:
        """A `Columns` table, drawn here; anything else through Rich's `Console.print`."""
        if isinstance(renderable, Columns):
            cells = self.width() if self.isatty() else None
            self.write_text("\n".join([*renderable.lines(color=self.color(), cells=cells), ""]))
            return
        self.console.print(renderable, **kwargs)

    def isatty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def width(self) -> int:
        import shutil

        return shutil.get_terminal_size().columns

    def write_line(self, parts: Sequence[object]) -> None:
        color = self.color()
        self.write_text("".join(_paint(*_text_and_style(part), color) for part in parts) + "\n")

    def write_text(self, text: str) -> None:
        stream = self.stream
        stream.write(text)
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


def table(*headers: str) -> Columns:
    """A table with these column headers, for `Terminal.print`."""
    return Columns(*headers)


def row(table: Table | Columns, *cells: object) -> None:
    """`table.add_row` with every cell literal (a `Styled` cell: corral's own, with its style)."""
    if isinstance(table, Columns):
        table.add_row(*cells)
        return
    from rich.text import Text

    table.add_row(
        *(
            c if isinstance(c, Text) else Text(c.text, style=c.style) if isinstance(c, Styled) else literal(c)
            for c in cells
        )
    )
