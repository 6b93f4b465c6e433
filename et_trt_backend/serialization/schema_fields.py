"""The fields of a table of schema.fbs, named as et-trt names them."""

from __future__ import annotations

import re


def schema_fields(table_t: type) -> dict[str, str]:
    """{snake_case name: camelCase name} of the fields of a table, in schema.fbs's order: flatc's object API
    class `table_t` (e.g. schema_generated.BuildOptionsT) has them as attributes in camelCase."""
    return {re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name): name for name in vars(table_t())}
