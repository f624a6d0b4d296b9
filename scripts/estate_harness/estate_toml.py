"""The one writer of a test estate's spillwayd configuration (TOML), for the
e2e tests, the drills and the dpdk tests.

    estate_toml(dataplane={...}, ports=[{...}], pools=[{...}], vips=[{...}],
                backends=[{...}], sections={"policy": {...}}, comment="...")

Each table is a dict of keys in the order they are written; a value is
written as TOML (str, bool, int, float, lists, a dict inside a list as an
inline table). A dict value of a table is its sub-table: in a pool,
{"health": {...}} becomes [pool.health]; in [dataplane], {"timeouts": {...}}
becomes [dataplane.timeouts]. `sections` are further top-level tables
([policy], [control], [placement], [announce], [tier]), written after the
VIPs, then `raw` lines; the backends come last. A table whose dict holds a key "_lines" gets
those lines verbatim after its keys (a test's own raw TOML).

Thread contract: pure functions.
"""
import json
import os


def toml_value(v):
    """A Python value as a TOML value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML value for {v!r}")


def table(header, keys, array=False):
    """The lines of one table ([header], or [[header]] with array) and its
    sub-tables, with a blank line after each."""
    lines = [f"[[{header}]]" if array else f"[{header}]"]
    subs = []
    for k, v in keys.items():
        if k == "_lines":
            continue
        if isinstance(v, dict):
            subs.append((k, v))
        else:
            lines.append(f"{k} = {toml_value(v)}")
    lines += list(keys.get("_lines", ())) + [""]
    for k, v in subs:
        lines += table(f"{header}.{k}", v)
    return lines


def estate_toml(dataplane, ports=(), pools=(), vips=(), backends=(), sections=None,
                raw=(), comment=None):
    """The configuration's text (see the module's note); `raw`: lines of a
    test's own top-level tables, after `sections`."""
    lines = [f"# {comment}"] if comment else []
    lines += table("dataplane", dataplane)
    for group, items in (("port", ports), ("pool", pools), ("vip", vips)):
        for keys in items:
            lines += table(group, keys, array=True)
    for name, keys in (sections or {}).items():
        lines += table(name, keys)
    lines += list(raw) + ([""] if raw else [])
    for keys in backends:
        lines += table("backend", keys, array=True)
    return "\n".join(lines)


def write_estate_toml(path, **kw):
    """estate_toml(**kw) written to `path` (through a temporary file and a
    rename, so a reader never sees half a file); returns path."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(estate_toml(**kw))
    os.replace(tmp, path)
    return path
