"""bench/cardinality.py counts what it says: vLLM's side scales with instances from the recorded
/metrics, the gateway's with upstreams, the collector's with drafters; tag values add only the
leader's drift series (one per drafted instance x tenant here), never past the drift cap."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from cardinality import VLLM_METRICS, Fleet, bill, text_series  # noqa: E402

from specwatch.alerts.detector_settings import DriftSettings  # noqa: E402


def test_the_bill_grows_with_instances_and_drafters_never_with_tags():
    text = VLLM_METRICS.read_text()
    assert text_series(text, "vllm:spec_decode_num_accepted_tokens_per_pos") == 2 * 8  # k = 8, _total and _created
    one, two, drafters, tags = (
        bill(f, text, 2) for f in (Fleet(1, 1, 1), Fleet(2, 1, 1), Fleet(2, 2, 1), Fleet(2, 1, 300))
    )
    assert two.vllm == 2 * one.vllm == 2 * text_series(text)
    assert two.gateway == 2 * one.gateway and two.engine == one.engine
    assert drafters.replica > two.replica and drafters.engine > two.engine
    assert (tags.engine, tags.gateway, tags.replica) == (two.engine, two.gateway, two.replica)
    # 300 records: the 150 speculative ones each carry their own tenant (one drift series each);
    # with one tenant the 4 speculative records make 2 series (one per instance)
    assert tags.leader - two.leader == 150 - 2 <= DriftSettings().max_series
    assert two.added == two.gateway + two.leader + two.replica and two.leader >= two.replica
