"""The Store options an engine's config may carry (`_engines.STORE_OPTIONS`, which every backend
accepts and refuses the rest of) are exactly the keyword arguments of `tierkv_g3.Store`: a
keyword added to the Store reaches the engines' configs, or this test says which is missing."""

from __future__ import annotations

import inspect

import tierkv_g3
from tierkv_g3._engines import STORE_OPTIONS


def test_the_engines_option_list_is_the_stores_keywords():
    params = inspect.signature(tierkv_g3.Store).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"root", "worker"} <= set(params) and keywords
    assert set(STORE_OPTIONS) == keywords, (
        f"missing from STORE_OPTIONS: {sorted(keywords - set(STORE_OPTIONS))}; "
        f"not Store keywords: {sorted(set(STORE_OPTIONS) - keywords)}"
    )
    assert len(STORE_OPTIONS) == len(set(STORE_OPTIONS))
