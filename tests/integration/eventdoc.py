"""docs/events.md as data: its table of each event's fields at a glance, read once, and the check
that an event object carries what the table lists, no more, no less, each of the type it gives
(issues #34, #31; the unit test agent-eventtable holds the table to the agent's own). Used by
test_events.py's scenarios and by every dltest.Case that wrote an event stream."""
import os
import re

ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
_TABLES = None
_TYPES = {}


def table_cells(line: str) -> list:
    """The cells of a Markdown table row: '|' inside `code` or escaped as '\\|' is text."""
    out, cur, code, i = [], "", False, 0
    s = line.strip()
    while i < len(s):
        c = s[i]
        if c == "\\" and s[i + 1:i + 2] == "|":
            cur += "|"
            i += 2
            continue
        if c == "`":
            code = not code
        if c == "|" and not code:
            out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    return out[1:]


def events_md() -> tuple:
    """({event: its fields cell}, {event: (always, when they apply)}): docs/events.md's main
    table and its table of fields at a glance."""
    global _TABLES
    if _TABLES is None:
        with open(os.path.join(ROOT, "docs", "events.md")) as f:
            text = f.read()
        at = text.index("| event | always | when they apply |")
        main, rest = text[:at], text[at:].split("\n\n", 1)[0]
        rows = {}
        for line in main.splitlines():
            if line.startswith("| `"):
                cells = table_cells(line)
                rows[cells[0].strip().strip("`")] = cells[1]
        table = {}
        for line in rest.splitlines()[2:]:
            cells = table_cells(line)
            event = cells[0].strip().strip("`")
            table[event] = (set(re.findall(r"`(\w+)`", cells[1])),
                            set(re.findall(r"`(\w+)`", cells[2])))
            # "`rank` int, `interface` string or null": each field's type after its name.
            _TYPES[event] = {name: kind.strip(" ,") for cell in cells[1:3]
                             for name, kind in re.findall(r"`(\w+)`([^`]*)", cell)}
        _TABLES = rows, table
    return _TABLES


def of_type(kind: str, value) -> bool:
    """Whether value is of the glance table's type kind ("int", "string or null", "int[]")."""
    if " or " in kind:
        return any(of_type(k, value) for k in kind.split(" or "))
    if kind.endswith("[]"):
        return isinstance(value, list) and all(of_type(kind[:-2], v) for v in value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return {"null": value is None, "float": isinstance(value, float),
            "string": isinstance(value, str), "bool": isinstance(value, bool),
            "true": value is True, "object": isinstance(value, dict)}.get(kind, False)


def mismatch(event: dict) -> str:
    """Why event is not what docs/events.md lists ('' when it is)."""
    table = events_md()[1]
    if event.get("event") not in table:
        return f"an event docs/events.md does not list: {event}"
    always, maybe = table[event["event"]]
    keys = set(event) - {"event", "time"}
    if always - keys:
        return f"missing {sorted(always - keys)} (docs/events.md): {event}"
    if keys - always - maybe:
        return f"not in docs/events.md: {sorted(keys - always - maybe)}: {event}"
    types = _TYPES[event["event"]]
    wrong = [f"{k} is not {types[k]}" for k in sorted(keys) if not of_type(types[k], event[k])]
    if wrong:
        return f"{', '.join(wrong)} (docs/events.md): {event}"
    return ""
