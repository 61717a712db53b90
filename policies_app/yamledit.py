"""Edits of a policy's YAML source that keep everything else as it was written: comments, key
order, blank lines, flow or block style. Used where Airlock drafts a change for a person
("Allow this", "Add as a test"): the draft's diff is the change and nothing more.

The source is read with PyYAML's composer, whose nodes know where they start and end; an edit
inserts text after the last thing an entry holds (never after the comments that follow it, which
head the next section) or replaces one scalar's text. Anything this does not handle (an alias, a
mapping written as a flow inside a flow, a document that is not a mapping) raises `Unsupported`,
and the caller decides what to do; callers check the result parses to the document they meant."""

import yaml

INDENT = 2


class Unsupported(Exception):
    pass


def append_item(source: str, path: tuple[str, ...], item, *, comment: str = "") -> str:
    """`source` with `item` appended to the sequence at `path` (created, with any missing parent
    mapping, where absent), after `comment` lines (for a list written in flow style: above the
    line it is on)."""
    root = _root(source)
    mapping, missing = _deepest_mapping(root, path[:-1])
    if missing or _child(mapping, path[-1]) is None:
        keys = [*missing, path[-1]]
        return _add_key(source, mapping, keys[0], _nested(keys[1:], [item]), comment=comment)
    node = _child(mapping, path[-1])
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return _replace_null(source, mapping, path[-1], node, [item], comment)
    if not isinstance(node, yaml.SequenceNode):
        raise Unsupported(f"{'.'.join(path)} is not a list")
    if node.flow_style or not node.value:
        return _flow_append(source, node, item, comment)
    last = node.value[-1]
    if last.start_mark.index < node.start_mark.index:  # an alias: its text is the anchor's, elsewhere
        raise Unsupported(f"{'.'.join(path)} ends with an alias")
    dash = _dash_column(source, last)
    flow = isinstance(last, yaml.MappingNode) and last.flow_style
    text = f"- {_flow(item)}\n" if flow else _block([item])
    return _insert_after(source, last, _indented(_commented(comment) + text, dash))


def set_scalar(source: str, path: tuple[str, ...], value) -> str:
    """`source` with the scalar at `path` replaced by `value` (added where the key is absent)."""
    root = _root(source)
    mapping, missing = _deepest_mapping(root, path[:-1])
    node = None if missing else _child(mapping, path[-1])
    if node is None:
        keys = [*missing, path[-1]]
        return _add_key(source, mapping, keys[0], _nested(keys[1:], value))
    if not isinstance(node, yaml.ScalarNode):
        raise Unsupported(f"{'.'.join(path)} is not a single value")
    return source[: node.start_mark.index] + _flow(value) + source[node.end_mark.index:]


def _nested(keys: list[str], value):
    """`value` under `keys`, outermost first: (["a", "b"], 1) is {"a": {"b": 1}}."""
    for key in reversed(keys):
        value = {key: value}
    return value


def _root(source: str) -> yaml.MappingNode:
    try:
        root = yaml.compose(source, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError) as exc:
        raise Unsupported(f"not valid YAML ({exc})") from None
    if root is None:
        return yaml.MappingNode("tag:yaml.org,2002:map", [], flow_style=False)
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        raise Unsupported("the document is not a block mapping")
    return root


def _child(mapping: yaml.MappingNode, key: str):
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node
    return None


def _deepest_mapping(root: yaml.MappingNode, path: tuple[str, ...]) -> tuple[yaml.MappingNode, list[str]]:
    """The mapping at `path`, or the deepest one on it that exists and the keys missing below it."""
    node = root
    for depth, key in enumerate(path):
        child = _child(node, key)
        if child is None or (isinstance(child, yaml.ScalarNode) and child.tag == "tag:yaml.org,2002:null"):
            if child is not None:
                raise Unsupported(f"{key} is empty")
            return node, list(path[depth:])
        if not isinstance(child, yaml.MappingNode):
            raise Unsupported(f"{key} is not a mapping")
        node = child
    return node, []


def _add_key(source: str, mapping: yaml.MappingNode, key: str, value, *, comment: str = "") -> str:
    if mapping.flow_style:
        raise Unsupported(f"cannot add {key} to a mapping written in flow style")
    if not mapping.value:  # the empty document
        return _with_newline(source) + _commented(comment) + _block({key: value}, depth=-2)
    first_key = mapping.value[0][0]
    column = first_key.start_mark.column
    text = _indented(_commented(comment) + _block({key: value}, depth=-2), column)
    return _insert_after(source, mapping.value[-1][1], text)


def _replace_null(source: str, mapping, key: str, node, value: list, comment: str) -> str:
    """`key:` with nothing after it: the list goes on the lines below it."""
    key_node = next(k for k, v in mapping.value if v is node)
    column = key_node.start_mark.column + INDENT
    end = _line_end(source, key_node.end_mark.index)
    return source[:end] + "\n" + _indented(_commented(comment) + _block(value), column).rstrip("\n") + source[end:]


def _flow_append(source: str, node: yaml.SequenceNode, item, comment: str) -> str:
    """`[a, b]` becomes `[a, b, item]`; the comment goes on the line above the one the list is on."""
    start, end = node.start_mark.index, node.end_mark.index
    written = source[start:end]
    if not node.flow_style:  # an empty block list cannot be: a flow `[]` it is
        raise Unsupported("an empty list that is not []")
    if "#" in written or "&" in written or "*" in written:  # a comment, an anchor or an alias inside
        raise Unsupported("a list written in flow style with a comment, an anchor or an alias in it")
    inner = written[1:-1].rstrip().removesuffix(",").rstrip()  # `[a, b,]`: its trailing comma goes
    separator = ", " if inner.strip() else ""
    edited = source[:start] + "[" + inner + separator + _flow(item) + "]" + source[end:]
    line_start = source.rfind("\n", 0, start) + 1
    column = len(source[line_start:start]) - len(source[line_start:start].lstrip(" "))
    return edited[:line_start] + _indented(_commented(comment), column) + edited[line_start:]


def _insert_after(source: str, node, text: str) -> str:
    """Insert whole lines after the line where `node`'s last content ends."""
    end = _line_end(source, _content_end(node))
    if end == len(source):
        return _with_newline(source) + text
    return source[: end + 1] + text + source[end + 1:]


def _content_end(node, after: int = 0) -> int:
    """Where the last thing a node holds ends: a block collection's own end mark lies at the next
    token, past the comments and blank lines that follow it. A node that starts before `after`
    (the one holding it) is an alias, whose text is its anchor's, elsewhere."""
    if node.start_mark.index < after:
        raise Unsupported("an alias")
    after = node.start_mark.index
    if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False):
        end = node.end_mark.index
        return end - 1 if getattr(node, "style", None) in ("|", ">") and end else end
    if isinstance(node, yaml.MappingNode):
        return _content_end(node.value[-1][1], after) if node.value else node.start_mark.index
    if isinstance(node, yaml.SequenceNode):
        return _content_end(node.value[-1], after) if node.value else node.start_mark.index
    raise Unsupported("an alias or an unknown node")


def _line_end(source: str, index: int) -> int:
    newline = source.find("\n", index)
    return len(source) if newline == -1 else newline


def _dash_column(source: str, item) -> int:
    line_start = source.rfind("\n", 0, item.start_mark.index) + 1
    dash = source.find("-", line_start, item.start_mark.index)
    if dash == -1:
        raise Unsupported("a list item without its dash on its line")
    return dash - line_start


class _Dumper(yaml.SafeDumper):
    """Block style, except what reads best on one line: a list of plain values (`args: [test]`),
    and a small mapping inside an item (`expect: {allowed: true}`)."""


class _FlowMapping(dict):
    pass


def _plain(value) -> bool:
    return not isinstance(value, (list, dict)) or (isinstance(value, list) and all(map(_plain, value)))


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=all(map(_plain, data))))
_Dumper.add_representer(_FlowMapping, lambda dumper, data: dumper.represent_mapping(
    "tag:yaml.org,2002:map", data.items(), flow_style=True))


def _shaped(value, depth: int):
    """Mappings inside a list's item (`depth` 0 is the item) whose values are plain are written as flow."""
    if isinstance(value, dict):
        items = {key: _shaped(item, depth + 1) for key, item in value.items()}
        return _FlowMapping(items) if depth >= 1 and all(map(_plain, value.values())) else items
    if isinstance(value, list):
        return [_shaped(item, depth + 1) for item in value]
    return value


def _block(value, *, depth: int = -1) -> str:
    """`value` in block style; `depth`: how far above an item it is (a list of items: -1)."""
    return yaml.dump(_shaped(value, depth), Dumper=_Dumper, default_flow_style=False, sort_keys=False,
                     allow_unicode=True, width=1000, indent=INDENT)


def _flow(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, allow_unicode=True, width=10**6)
    return text.removesuffix("\n...\n").rstrip("\n")


def _commented(comment: str) -> str:
    return "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""


def _indented(text: str, column: int) -> str:
    pad = " " * column
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def _with_newline(source: str) -> str:
    return source if not source or source.endswith("\n") else source + "\n"
