"""Hypothesis properties at two strengths: fewer examples in `make test-fast`, all of them in `make test` (deep)."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import settings


def fast_and_deep(prop: Callable, fast: int, full: int, given_: Callable, **options) -> tuple[Callable, Callable]:
    """Two tests of the property `prop` under `given_` (its `@given(...)`) and `settings(**options)`: one of `fast`
    examples, and one of `full` examples marked `deep` (`make test` runs both, `make test-fast` the first)."""
    def test(examples: int) -> Callable:
        return settings(max_examples=examples, **options)(given_(prop))

    return test(fast), pytest.mark.deep(test(full))
