"""What cmd.exe did to a line the JuNE extension echoed into its log: the model that names and proves damage.

cmd.exe parsed the echoed line before `echo` saw it. Its quote state toggles at every `"` (a backslash escapes
nothing), and outside its quotes:

- `>` or `<` (also `>>`, `>&`, with a digit right before it naming the handle) is a redirection: it and its file
  name (after any delimiters `space tab , ; =`, a token up to the next delimiter outside quotes) vanish, and the
  line goes on after them. When the file name runs to the end of the line, the line is cut short.
- `|` or `&` ends the command: that line never reached the log.
- `^` escapes the next character and vanishes.

In the extension's lines every key and string value starts outside cmd's quotes, so code outside Python string
literals is exposed and text inside them is not (`x > 1` loses `> 1`, `"->"` survives). Checked on the real logs:
every line of the three cmd.exe writers is left unchanged by `echoed` (nothing in them is still exposed), and each
damaged line that the participant's final notebook holds the text of is reproduced exactly from that text.
"""

from __future__ import annotations

from dataclasses import dataclass

DELIMITERS = " \t,;="
_REDIRECTIONS = "<>"
_SEPARATORS = "|&"
_ESCAPE = "^"


@dataclass(frozen=True)
class Echoed:
    """What reached the log from echoing a text: `text`, or None when a `|` or `&` kept the line from the log;
    `eating` is non-zero when the text ended inside a redirection that would go on eating what follows (1: still
    before its file name, 2: inside it), `quoted` is cmd's quote state at the end, and `cuts` are the places in
    `text` where something was eaten."""

    text: str | None
    eating: int = 0
    quoted: bool = False
    cuts: tuple[int, ...] = ()


@dataclass
class _State:
    quoted: bool = False
    eating: int = 0  # 0: no redirection; 1: delimiters after the operator; 2: inside its file name


def _eat(state: _State, char: str) -> bool:
    """Feed one character to a redirection in progress; False when it ends the file name (and is not eaten)."""
    if state.eating == 1:
        if char in DELIMITERS:
            return True
        state.eating = 2
    if char == '"':
        state.quoted = not state.quoted
        return True
    if not state.quoted and (char in DELIMITERS or char in _REDIRECTIONS or char in _SEPARATORS):
        state.eating = 0
        return False
    return True


def echoed(text: str, *, quoted: bool = False, eating: int = 0) -> Echoed:
    """The part of `text` cmd.exe's `echo TEXT >> log` wrote; `quoted`/`eating` continue an `Echoed` state, so a
    line can be echoed piece by piece.

    >>> echoed('"a" b > c d').text, echoed('"x > y" z').text, echoed('p ^q | r').text
    ('"a" b  d', '"x > y" z', None)
    >>> echoed('a > "b c" d').text, echoed('f(x)1>0 e').text, echoed('y >= 1').eating
    ('a  d', 'f(x) e', 2)
    """
    out: list[str] = []
    cuts: list[int] = []
    state = _State(quoted=quoted, eating=eating)
    i = 0
    while i < len(text):
        char = text[i]
        if state.eating and _eat(state, char):
            i += 1
            continue
        if char == '"':
            state.quoted = not state.quoted
        elif not state.quoted and char == _ESCAPE:
            cuts.append(len(out))
            out.append(text[i + 1:i + 2])
            i += 2
            continue
        elif not state.quoted and char in _SEPARATORS:
            return Echoed(None)
        elif not state.quoted and char in _REDIRECTIONS:
            if i and text[i - 1].isdigit() and out and out[-1] == text[i - 1]:
                out.pop()  # `2>`: the digit names the handle
            cuts.append(len(out))
            i += 1
            if i < len(text) and text[i] in ">&":
                i += 1
            state.eating = 1
            continue
        out.append(char)
        i += 1
    return Echoed("".join(out), eating=state.eating, quoted=state.quoted, cuts=tuple(cuts))
