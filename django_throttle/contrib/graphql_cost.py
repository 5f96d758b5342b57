"""The cost of a GraphQL operation read from its parsed document (graphql-core's AST, which
Strawberry and Graphene 3 both use): what ``ThrottleExtension`` charges by default.

Only graphql-core is imported here, so a Graphene project can use :func:`query_cost` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
)

# The arguments that say how many items a list field returns (Relay's and the usual offset
# pagination's names).
PAGE_ARGUMENTS = frozenset({"first", "last", "limit"})
# A cost the store counts exactly (Lua numbers are doubles); any query this dear is refused.
MAX_COST = 2**31 - 1


def query_cost(
    document: DocumentNode,
    operation_name: str | None = None,
    variables: Mapping[str, Any] | None = None,
) -> int:
    """The fields an operation selects, a field's subtree multiplied by its ``first``,
    ``last`` or ``limit`` argument (a literal or a variable): ``{ users(first: 50) { id name
    } }`` costs 1 + 50 x 2 = 101. A fragment is costed once however often it is spread, so
    the work is linear in the document's size."""
    fragments = {
        node.name.value: node
        for node in document.definitions
        if isinstance(node, FragmentDefinitionNode)
    }
    operations = [
        node for node in document.definitions if isinstance(node, OperationDefinitionNode)
    ]
    if operation_name is not None:
        operations = [
            o for o in operations if o.name is not None and o.name.value == operation_name
        ]
    if not operations:
        return 1
    counter = _Counter(fragments, variables or {})
    return max(1, min(MAX_COST, counter.selections(operations[0].selection_set)))


class _Counter:
    def __init__(
        self, fragments: Mapping[str, FragmentDefinitionNode], variables: Mapping[str, Any]
    ) -> None:
        self.fragments = fragments
        self.variables = variables
        self.costed: dict[str, int] = {}
        self.costing: set[str] = set()  # a cycle (invalid GraphQL) costs nothing more

    def selections(self, selection_set: SelectionSetNode | None) -> int:
        if selection_set is None:
            return 0
        total = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                total += 1 + self.items(selection) * self.selections(selection.selection_set)
            elif isinstance(selection, InlineFragmentNode):
                total += self.selections(selection.selection_set)
            elif isinstance(selection, FragmentSpreadNode):
                total += self.fragment(selection.name.value)
            total = min(total, MAX_COST)
        return total

    def fragment(self, name: str) -> int:
        if name in self.costed:
            return self.costed[name]
        definition = self.fragments.get(name)
        if definition is None or name in self.costing:
            return 0
        self.costing.add(name)
        self.costed[name] = self.selections(definition.selection_set)
        self.costing.discard(name)
        return self.costed[name]

    def items(self, field: FieldNode) -> int:
        """The page size a field asks for: its first/last/limit argument, else 1."""
        for argument in field.arguments or ():
            if argument.name.value not in PAGE_ARGUMENTS:
                continue
            value = argument.value
            if isinstance(value, IntValueNode):
                return _whole(value.value)
            if isinstance(value, VariableNode):
                return _whole(self.variables.get(value.name.value))
        return 1


def _whole(value: Any) -> int:
    """A page size as a count of items: a missing or malformed one (the schema refuses it
    later) counts as one item, a negative one as none."""
    try:
        return max(0, min(MAX_COST, int(value)))
    except (TypeError, ValueError, OverflowError):
        return 1
