"""A job group request (a sweep) turned into its members: the grid's cartesian product or the list of specs,
each merged over the base spec and checked like a single job. Every problem names where it is: ``grid.<path>``
for the grid itself, ``members.<i>.<field>`` (with the grid values) or ``specs.<i>.<field>`` for a member.

A small body can stand for a large group (a 4 KB base times 10,000 grid combinations), so before anything is
expanded the request's nesting depth and its members' total size (each member's base plus its own values, as
compact JSON) are bounded, from one serialisation of each value. Members share the base's unchanged parts
instead of copying them (validation only reads its input), and parses of text they share (a formula) are
made once per group (the validation context's memo)."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from api.job_checks import dataset_column_errors, dataset_columns, dataset_errors, invalid
from api.problems import field_error, validation_errors
from api.schemas import JobGroupRequest
from api.work_cap import cpu_cap_errors
from core.settings import Settings
from kernels.registry import get_kind
from kernels.spec import PARSE_MEMO, JobParams
from store.groups import MemberSpec

# A grid key: "params." and a dotted path of field names (a nested section's field: params.grid.n_points).
GRID_PATH = re.compile(r"^params(\.[A-Za-z_][A-Za-z0-9_]*)+$")
MAX_GRID_PATHS = 32
# Errors listed in one 422: a grid of 10,000 members with one mistake must not answer 10,000 errors.
MAX_LISTED_ERRORS = 20
SPEC_KEYS = frozenset({"kind", "params"})
# Objects and lists nested in a group's base, grid values or specs: deeper than any kind's params go, and
# shallow enough for every recursive reader after this (serialisers, validators) to stay far from their limits.
MAX_NESTING_DEPTH = 32


def _set_path(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``spec`` with ``value`` at ``path``: the objects along the path are new, everything else is shared."""
    head, _, rest = path.partition(".")
    updated = dict(spec)
    child = spec.get(head)
    updated[head] = _set_path(child if isinstance(child, dict) else {}, rest, value) if rest else value
    return updated


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, nested objects merged key by key (a list or a value replaces); the parts
    neither changes are shared, not copied."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _too_deep(value: Any, limit: int = MAX_NESTING_DEPTH) -> bool:
    """Whether ``value`` nests objects or lists more than ``limit`` deep (read without recursion)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, Mapping | list):
                if depth + 1 > limit:
                    return True
                pending.append((child, depth + 1))
    return False


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def depth_errors(request: JobGroupRequest) -> list[dict[str, Any]]:
    parts: list[tuple[str, Any]] = []
    if request.base is not None:
        parts.append(("base.params", request.base.params))
    parts.extend((f"grid.{path}", values) for path, values in (request.grid or {}).items())
    parts.extend((f"specs.{index}", item) for index, item in enumerate(request.specs or []))
    return [
        field_error(where, f"nests objects or lists more than {MAX_NESTING_DEPTH} deep", type_="too_deep")
        for where, value in parts
        if _too_deep(value, MAX_NESTING_DEPTH - where.count("."))
    ][:MAX_LISTED_ERRORS]


def expanded_size(base_size: int, grid: Mapping[str, list[Any]] | None, specs: list[dict[str, Any]] | None) -> int:
    """Bytes the members' specs total once expanded, at most: per member the base's size plus its grid values'
    (or its spec's). A grid value appears in members / len(values) members, so each is serialised once."""
    if grid is not None:
        members = math.prod(len(values) for values in grid.values())
        values_size = sum(members // len(values) * sum(map(_json_size, values)) for values in grid.values())
        return members * base_size + values_size
    return sum(base_size + _json_size(item) for item in specs or [])


def size_errors(request: JobGroupRequest, base: Any, max_bytes: int) -> list[dict[str, Any]]:
    total = expanded_size(_json_size(base) if base is not None else 0, request.grid, request.specs)
    if total <= max_bytes:
        return []
    field = "grid" if request.grid is not None else "specs"
    return [
        field_error(
            field,
            f"the members' specs would total {total:,} bytes once expanded (each member's base plus its "
            f"{'grid values' if field == 'grid' else 'spec'}); a group's may total at most {max_bytes:,}: fewer "
            "members or a smaller base",
            type_="group_too_large",
            constraint={"le": max_bytes},
        )
    ]


def _leaves(value: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every non-object value (lists are values)."""
    for key, item in value.items():
        path = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            yield from _leaves(item, f"{path}.")
        else:
            yield path, item


def grid_errors(grid: Mapping[str, list[Any]], max_members: int) -> list[dict[str, Any]]:
    errors = []
    if not grid:
        errors.append(field_error("grid", "a grid needs at least one path with its values", type_="grid_empty"))
    if len(grid) > MAX_GRID_PATHS:
        errors.append(field_error("grid", f"at most {MAX_GRID_PATHS} paths", type_="grid_too_many_paths"))
    for path, values in grid.items():
        where = f"grid.{path}"
        if not GRID_PATH.match(path):
            errors.append(
                field_error(where, "a grid key is a dotted params path such as params.n_clusters", type_="grid_path")
            )
        elif path.count(".") > MAX_NESTING_DEPTH:
            errors.append(field_error(where, f"at most {MAX_NESTING_DEPTH} levels deep", type_="grid_path"))
        elif any(path != other and other.startswith(path + ".") for other in grid):
            errors.append(
                field_error(where, "contains another grid path; give one or the other", type_="grid_path_overlap")
            )
        if not values:
            errors.append(field_error(where, "give at least one value", type_="grid_values_empty"))
    size = math.prod(len(values) for values in grid.values()) if grid else 0
    if size > max_members:
        errors.append(
            field_error(
                "grid",
                f"the grid makes {size:,} members; a group holds at most {max_members:,}",
                type_="group_too_large",
                constraint={"le": max_members},
            )
        )
    return errors


def planned_members(
    request: JobGroupRequest, max_members: int, max_bytes: int
) -> tuple[list[tuple[str, dict[str, Any], dict]], list]:
    """Each member's (error prefix, spec, grid values) and the paths that vary; 422 for a malformed request
    or one whose members would pass ``max_members`` or total more than ``max_bytes``, before any is made."""
    errors = depth_errors(request)
    if errors:
        raise invalid(errors)
    base = {"kind": request.base.kind, "params": request.base.params} if request.base is not None else None
    if (request.grid is None) == (request.specs is None):
        raise invalid(
            [field_error("grid", "give either grid (with base) or specs, not both or neither", type_="grid_or_specs")]
        )
    if request.grid is not None:
        if base is None:
            raise invalid([field_error("base", "a grid needs the base spec its values go into", type_="missing")])
        errors = grid_errors(request.grid, max_members) or size_errors(request, base, max_bytes)
        if errors:
            raise invalid(errors)
        paths = list(request.grid)
        planned = []
        for index, combination in enumerate(itertools.product(*request.grid.values())):
            values = dict(zip(paths, combination, strict=True))
            spec = base
            for path, value in values.items():
                spec = _set_path(spec, path, value)
            planned.append((f"members.{index}", spec, values))
        return planned, paths
    assert request.specs is not None
    if not request.specs:
        raise invalid([field_error("specs", "give at least one spec", type_="too_short")])
    if len(request.specs) > max_members:
        raise invalid(
            [
                field_error(
                    "specs",
                    f"{len(request.specs):,} specs; a group holds at most {max_members:,}",
                    type_="group_too_large",
                    constraint={"le": max_members},
                )
            ]
        )
    errors = size_errors(request, base, max_bytes)
    if errors:
        raise invalid(errors)
    planned, varying = [], {}
    for index, item in enumerate(request.specs):
        unknown = sorted(set(item) - SPEC_KEYS)
        if unknown:
            raise invalid(
                [
                    field_error(
                        f"specs.{index}.{unknown[0]}", "a spec holds only kind and params", type_="extra_forbidden"
                    )
                ]
            )
        spec = _merge(base or {}, item)
        values = dict(_leaves(item))
        varying.update(dict.fromkeys(values))
        planned.append((f"specs.{index}", spec, values))
    return planned, list(varying)


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{path}={json.dumps(value)}" for path, value in values.items())


class MemberChecker:
    """Checks members like single jobs, reading each dataset's schema once for the whole group."""

    def __init__(self, session: Session, owner: str, request_adapter: TypeAdapter[Any], kind_tags: list[str],
                 settings: Settings | None = None) -> None:
        self._session, self._owner = session, owner
        self._adapter, self._tags = request_adapter, kind_tags
        self._settings = settings  # for the CPU work cap (api/work_cap.py); None: not checked
        self._datasets: dict[str, tuple[list[dict[str, Any]], dict[str, list[str]]]] = {}
        self._parses: dict[Any, Any] = {}  # one parse per distinct formula (or other parsed text) of the group

    def check(self, prefix: str, spec: dict[str, Any], values: Mapping[str, Any]) -> tuple[MemberSpec | None, list]:
        """The member, or None and its errors (fields prefixed, messages naming its grid values)."""
        try:
            body = self._adapter.validate_python(
                {"kind": spec.get("kind"), "params": spec.get("params", {})}, context={PARSE_MEMO: self._parses}
            )
        except ValidationError as error:
            raw = [{**item, "loc": ("body", *item["loc"])} for item in error.errors()]
            return None, self._prefixed(prefix, validation_errors(raw, self._tags), values)
        kind = get_kind(body.kind)
        params: JobParams = body.params  # validated once, above: the member stores its dump
        dataset_ids = kind.dataset_ids(params)
        errors = self._dataset_problems(params, dataset_ids)
        if not errors and self._settings is not None:
            errors = cpu_cap_errors(self._session, self._owner, kind, params, dataset_ids, self._settings)
        if errors:
            return None, self._prefixed(prefix, errors, values)
        return MemberSpec(kind.name, params.model_dump(mode="json"), dict(dataset_ids), dict(values)), []

    def _dataset_problems(self, params: JobParams, dataset_ids: Mapping[str, str]) -> list[dict[str, Any]]:
        if not dataset_ids:
            return []
        key = json.dumps(dict(dataset_ids), sort_keys=True)
        if key not in self._datasets:
            missing = dataset_errors(self._session, self._owner, dataset_ids)
            columns = {} if missing else dataset_columns(self._session, self._owner, dataset_ids)
            self._datasets[key] = (missing, columns)
        missing, columns = self._datasets[key]
        return missing or dataset_column_errors(params, columns)  # type: ignore[arg-type]

    @staticmethod
    def _prefixed(prefix: str, errors: list[dict[str, Any]], values: Mapping[str, Any]) -> list[dict[str, Any]]:
        member = f"member {prefix.rsplit('.', 1)[1]}" + (f" ({_describe(values)})" if values else "")
        return [
            {
                **error,
                "field": f"{prefix}.{error['field']}" if error["field"] != "body" else prefix,
                "message": f"{member}: {error['message']}",
            }
            for error in errors
        ]


def check_members(checker: MemberChecker, planned: list[tuple[str, dict[str, Any], dict]]) -> list[MemberSpec]:
    """Every member checked; one 422 listing the first errors (and how many members had errors)."""
    members, errors, failing = [], [], 0
    for prefix, spec, values in planned:
        member, member_errors = checker.check(prefix, spec, values)
        if member is None:
            failing += 1
            errors.extend(member_errors[: max(MAX_LISTED_ERRORS - len(errors), 0)])
        else:
            members.append(member)
    if failing:
        problem = invalid(errors)
        shown = "; ".join(f"{error['field']}: {error['message']}" for error in errors[:3])
        more = f" (the first {len(errors)} errors are listed)" if failing > 1 else ""
        problem.detail = f"{failing} of {len(planned)} members are invalid: {shown}{more}"
        problem.extensions["invalid_members"] = failing
        raise problem
    return members
