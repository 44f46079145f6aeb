"""The tree: YAML 1.1 read by a safe loader with limits, written by a safe dumper.

:class:`FinfLoader` is a ``yaml.SafeLoader`` subclass whose composer is iterative and bounded:
it counts nodes, nesting depth and aliases, and keeps the size every node would have with its
aliases expanded, so a billion-laughs tree is refused while it is being composed, before
anything is expanded; a recursive alias is refused outright. Constructors: the root tag
(``!finf``, ``!core/finf``) gives a :class:`Root`, ``!ndarray`` (``!core/ndarray``) an
:class:`NDArrayRef`; any other tag is kept as :class:`Tagged` (no code runs for it) except
``!!python/*`` tags, which are refused. :class:`FinfCLoader` is the same loader over libyaml's
event parser (10x faster scanning; the composer and constructors are the same Python code).

Writing always uses the pure-Python emitter so that equal trees give equal bytes on every
machine, with or without libyaml.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (AliasEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent)
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from ..errors import DataError, FormatError, LimitError
from . import _spec as S
from ._ndarray import NDArrayRef, ref_from_mapping

_NO_KEY = object()
_RESOLVED: dict[tuple, str] = {}     # (scalar, implicit) -> tag; the resolvers are fixed
_PYTHON_TAG = "tag:yaml.org,2002:python/"


class Root(dict):
    """The tree's root mapping; ``tag`` is the root tag it was read with."""

    def __init__(self, *args: Any, tag: str = S.ROOT_TAG, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tag = tag


@dataclass(eq=False)
class Tagged:
    """A node with a tag snapops does not interpret, kept so it can be written back."""

    tag: str
    value: Any


# ---- loading ------------------------------------------------------------------------------------

class FinfLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` + FINF tags + limits on size, depth and alias expansion.

    >>> FinfLoader.load_tree("%YAML 1.1\\n--- !<tag:stsci.edu:finf/0.1.0/finf>\\na: 1\\n...\\n")
    {'a': 1}
    """

    def __init__(self, stream: str, limits: S.Limits = S.DEFAULT_LIMITS,
                 line_base: int = 0) -> None:
        super().__init__(stream)
        self._init_limits(limits, line_base)

    def _init_limits(self, limits: S.Limits, line_base: int) -> None:
        self.limits = limits
        self.line_base = line_base
        self.anchors: dict = {}

    def line_of(self, mark) -> int | None:
        return None if mark is None else mark.line + 1 + self.line_base

    # -- composer: iterative, bounded -------------------------------------------------------
    def get_single_node(self):
        self.get_event()                                   # StreamStart
        node = None
        if not self.check_event(yaml.StreamEndEvent):
            self.get_event()                               # DocumentStart
            node = self._compose_bounded()
            self.get_event()                               # DocumentEnd
        if not self.check_event(yaml.StreamEndEvent):
            event = self.get_event()
            raise FormatError("the tree must hold exactly one YAML document",
                              line=self.line_of(event.start_mark), expected="one document",
                              got="another document")
        self.get_event()
        self.anchors = {}
        return node

    def _compose_bounded(self):
        limits = self.limits
        sizes: dict[int, int] = {}       # id(node) -> size with aliases expanded (done nodes)
        stack: list[list] = []           # [node, expanded size so far, pending mapping key]
        nodes = aliases = 0
        while True:
            event = self.get_event()
            kind = type(event)
            if kind is ScalarEvent:      # the hot path stays inline
                tag = event.tag
                if tag is None or tag == "!":
                    tag = self._resolve_scalar(event.value, event.implicit)
                node = ScalarNode(tag, event.value, event.start_mark, event.end_mark,
                                  style=event.style)
                size, nodes = 1, nodes + 1
                if event.anchor is not None:
                    self._anchor(event, node)
                    sizes[id(node)] = 1
            elif kind is SequenceStartEvent or kind is MappingStartEvent:
                nodes += 1
                stack.append([self._open_collection(event, len(stack), nodes), 1, _NO_KEY])
                continue
            elif kind is SequenceEndEvent or kind is MappingEndEvent:
                node, size, _ = stack.pop()
                node.end_mark = event.end_mark
                sizes[id(node)] = size
            elif kind is AliasEvent:
                aliases += 1
                node, size = self._alias(event, sizes, aliases)
            else:
                raise FormatError("unexpected YAML event", line=self.line_of(event.start_mark),
                                  expected="a node", got=kind.__name__)
            if nodes > limits.max_nodes:
                raise self._limit("tree has too many nodes", event, limits.max_nodes, nodes)
            if not stack:
                return node
            parent = stack[-1]
            parent[1] += size
            if parent[1] > limits.max_expanded:
                raise self._limit("tree too large once aliases are expanded", event,
                                  limits.max_expanded, parent[1])
            if type(parent[0]) is SequenceNode:
                parent[0].value.append(node)
            elif parent[2] is _NO_KEY:
                parent[2] = node
            else:
                parent[0].value.append((parent[2], node))
                parent[2] = _NO_KEY

    def _open_collection(self, event, depth: int, nodes: int):
        limits = self.limits
        if nodes > limits.max_nodes:
            raise self._limit("tree has too many nodes", event, limits.max_nodes, nodes)
        if depth >= limits.max_depth:
            raise self._limit("tree nested too deeply", event, limits.max_depth, depth + 1)
        cls = SequenceNode if type(event) is SequenceStartEvent else MappingNode
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(cls, None, event.implicit)
        node = cls(tag, [], event.start_mark, None, flow_style=event.flow_style)
        if event.anchor is not None:
            self._anchor(event, node)
        return node

    def _alias(self, event, sizes: dict[int, int], count: int):
        """The aliased node and its expanded size; refused past the limit or if recursive."""
        if count > self.limits.max_aliases:
            raise self._limit("too many aliases", event, self.limits.max_aliases, count)
        node = self.anchors.get(event.anchor)
        if node is None:
            raise FormatError("undefined alias", line=self.line_of(event.start_mark),
                              expected="an anchor defined earlier", got=event.anchor)
        size = sizes.get(id(node))
        if size is None:        # its anchor is still open: the alias points into itself
            raise FormatError("recursive alias", line=self.line_of(event.start_mark),
                              expected="an alias to a finished node", got=event.anchor,
                              check="alias")
        return node, size

    def _resolve_scalar(self, value: str, implicit) -> str:
        # trees repeat the same short scalars (source, dtype, little...): resolve each once
        key = (value, implicit)
        tag = _RESOLVED.get(key)
        if tag is None:
            tag = self.resolve(ScalarNode, value, implicit)
            if len(value) <= 32 and len(_RESOLVED) < 4096:
                _RESOLVED[key] = tag
        return tag

    def _anchor(self, event, node) -> None:
        if event.anchor in self.anchors:
            raise FormatError("duplicate anchor", line=self.line_of(event.start_mark),
                              expected="unique anchors", got=event.anchor)
        self.anchors[event.anchor] = node

    def _limit(self, message: str, event, limit: int, got: int) -> LimitError:
        return LimitError(message, line=self.line_of(event.start_mark), expected=f"<= {limit}",
                          got=got)

    # -- entry point ------------------------------------------------------------------------
    @classmethod
    def load_tree(cls, text: str, limits: S.Limits = S.DEFAULT_LIMITS,
                  line_base: int = 0) -> Root:
        return load_tree(text, limits, line_base, loader=cls)


def _construct_root(loader: FinfLoader, node):
    if not isinstance(node, MappingNode):
        raise FormatError("the root of the tree must be a mapping",
                          line=loader.line_of(node.start_mark), expected="a mapping",
                          got=node.id)
    data = Root(tag=node.tag)
    yield data
    data.update(loader.construct_mapping(node))


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"


def _scalar(loader: FinfLoader, node: ScalarNode) -> Any:
    if node.tag == _STR:
        return node.value
    if node.tag == _INT:
        return loader.construct_yaml_int(node)
    return loader.construct_object(node, deep=True)


def _flat_mapping(loader: FinfLoader, node: MappingNode) -> dict | None:
    """The common ``{key: scalar, shape: [scalars]}`` entry without the generic machinery
    (None: something else, e.g. a merge key; the caller falls back)."""
    out: dict[str, Any] = {}
    for key, value in node.value:
        if type(key) is not ScalarNode or key.tag != _STR:
            return None
        if type(value) is ScalarNode:
            out[key.value] = _scalar(loader, value)
        elif type(value) is SequenceNode and all(type(v) is ScalarNode for v in value.value):
            out[key.value] = [_scalar(loader, v) for v in value.value]
        else:
            return None
    return out


def _construct_ndarray(loader: FinfLoader, node) -> NDArrayRef:
    line = loader.line_of(node.start_mark)
    if not isinstance(node, MappingNode):
        raise FormatError("!ndarray must be a mapping", line=line, expected="a mapping",
                          got=node.id)
    mapping = _flat_mapping(loader, node)
    if mapping is None:
        mapping = loader.construct_mapping(node, deep=True)
    return ref_from_mapping(mapping, node.tag, line)


def _construct_tagged(loader: FinfLoader, suffix: str, node) -> Tagged:
    if node.tag.startswith(_PYTHON_TAG):
        raise FormatError("python tags are refused (safe loading only)",
                          line=loader.line_of(node.start_mark), expected="a data tag",
                          got=node.tag, check="unsafe_tag")
    if isinstance(node, MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return Tagged(node.tag, value)


for _tag in S.ROOT_TAGS:
    FinfLoader.add_constructor(_tag, _construct_root)
for _tag in S.NDARRAY_TAGS:
    FinfLoader.add_constructor(_tag, _construct_ndarray)
# Any other tag becomes Tagged (standard tags keep their safe constructors); this replaces
# SafeConstructor's fallback, which refuses unknown tags.
FinfLoader.add_multi_constructor(None, _construct_tagged)

try:
    from yaml._yaml import CParser
except ImportError:    # PyYAML without libyaml
    CParser = None
    FinfCLoader = None
else:
    class FinfCLoader(CParser, FinfLoader):   # type: ignore[no-redef]
        """:class:`FinfLoader` with libyaml's scanner and parser (same composer and limits)."""

        def __init__(self, stream: str, limits: S.Limits = S.DEFAULT_LIMITS,
                      line_base: int = 0) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._init_limits(limits, line_base)

        get_single_node = FinfLoader.get_single_node

LOADER = FinfCLoader or FinfLoader


def load_tree(text: str, limits: S.Limits = S.DEFAULT_LIMITS, line_base: int = 0,
              loader: type | None = None) -> Root:
    """Parse the tree text (``%YAML 1.1`` .. ``...``) into a :class:`Root`.

    ``line_base`` is the number of file lines before the tree (1: the header line), so
    errors name file lines. Raises only :class:`FormatError` (and its subclasses).
    """
    return load_tree_node(text, limits, line_base, loader)[0]


def load_tree_node(text: str, limits: S.Limits = S.DEFAULT_LIMITS, line_base: int = 0,
                   loader: type | None = None, select=None) -> tuple[Any, MappingNode]:
    """:func:`load_tree`, also returning the composed root node (with its marks).

    ``select(root_node)`` may pick the one node to construct (the rest is only composed,
    which checks syntax and limits); its data is returned as is.
    """
    instance = (loader or LOADER)(text, limits, line_base)
    try:
        node = instance.get_single_node()
        if node is None:
            raise FormatError("empty tree", line=line_base + 1, expected="a mapping",
                              got="no content")
        target = node if select is None else select(node)
        data = instance.construct_document(target)
        if target is not node:
            return data, node
    except FormatError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if "nesting depth" in str(exc.problem):  # libyaml's own cap (PyYAML >= 6.0.3 wheels)
            raise LimitError("tree nested too deeply", line=instance.line_of(mark),
                             expected=f"<= {limits.max_depth} levels", got="deeper") from exc
        raise FormatError(f"YAML: {exc.problem or exc.context}", line=instance.line_of(mark),
                          expected="valid YAML 1.1", got=_snippet(exc)) from exc
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise FormatError(f"YAML: {exc}", line=line_base + 1, expected="valid YAML 1.1",
                          got=type(exc).__name__) from exc
    except RecursionError as exc:
        raise LimitError("tree nested too deeply", line=line_base + 1,
                         expected=f"<= {limits.max_depth} levels", got="deeper") from exc
    finally:
        instance.dispose()
    if isinstance(data, Root):
        return data, node
    if isinstance(data, dict):
        return Root(data, tag=node.tag), node
    raise FormatError("the root of the tree must be a mapping", line=line_base + 1,
                      expected="a mapping", got=type(data).__name__)


def _snippet(exc: yaml.MarkedYAMLError) -> str:
    return (exc.problem or exc.context or type(exc).__name__)[:80]


def plain_value(value: Any) -> Any:
    """Tree data as plain Python data: dates become ISO strings, Tagged values their content."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, Tagged):
        return plain_value(value.value)
    if isinstance(value, NDArrayRef):
        return value.to_mapping()
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    return value


# ---- dumping ------------------------------------------------------------------------------------

class FinfDumper(yaml.SafeDumper):
    """Safe dumper for trees: ``!finf`` root, one-line ``!ndarray`` entries, plain meta."""


def _represent_root(dumper: FinfDumper, data: Root):
    return dumper.represent_mapping(data.tag, dict(data))


def _represent_ndarray(dumper: FinfDumper, ref: NDArrayRef):
    node = dumper.represent_mapping(ref.tag, ref.to_mapping(), flow_style=True)
    return node


def _represent_tagged(dumper: FinfDumper, item: Tagged):
    value = item.value
    if isinstance(value, dict):
        return dumper.represent_mapping(item.tag, value)
    if isinstance(value, (list, tuple)):
        return dumper.represent_sequence(item.tag, list(value))
    return dumper.represent_scalar(item.tag, str(value))


def _represent_tuple(dumper: FinfDumper, data: tuple):
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data))


_BREAKS = frozenset("\r\n\x85\u2028\u2029")


def _represent_str(dumper: FinfDumper, data: str):
    # PyYAML writes line breaks raw in plain/single-quoted scalars and folds a NEL back into
    # a space on reading; double quotes escape every break (\n, \N, \L, \P) exactly.
    if not _BREAKS.isdisjoint(data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_str(data)


def _represent_numpy_scalar(dumper: FinfDumper, data: np.generic):
    return dumper.represent_data(data.item())


FinfDumper.add_representer(Root, _represent_root)
FinfDumper.add_representer(NDArrayRef, _represent_ndarray)
FinfDumper.add_representer(Tagged, _represent_tagged)
FinfDumper.add_representer(tuple, _represent_tuple)
FinfDumper.add_representer(str, _represent_str)
FinfDumper.add_multi_representer(np.generic, _represent_numpy_scalar)

_DUMP_OPTS = dict(Dumper=FinfDumper, version=(1, 1), tags={"!": S.TAG_PREFIX}, sort_keys=False,
                  allow_unicode=True, default_flow_style=False, width=1 << 20)


def dump_tree(root: Root) -> str:
    """The tree text, ``%YAML 1.1`` through ``...`` and its newline.

    Example::

        dump_tree(Root({"meta": {}}))[:40]
        # -> '%YAML 1.1\\n%TAG ! tag:stsci.edu:finf/0.1.0/'
    """
    try:
        return yaml.dump(root, explicit_start=True, explicit_end=True, **_DUMP_OPTS)
    except yaml.YAMLError as exc:
        raise DataError(f"cannot write the tree: {exc}") from exc


def dump_section(key: str, value: Any) -> str:
    """``key: value`` as a block at column 0, for splicing into an existing tree."""
    try:
        return yaml.dump({key: value}, Dumper=FinfDumper, sort_keys=False, allow_unicode=True,
                         default_flow_style=False, width=1 << 20)
    except yaml.YAMLError as exc:
        raise DataError(f"cannot write the tree: {exc}") from exc
