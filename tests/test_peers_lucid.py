"""lucidrains' efficient-attention packages as peers: each builds and runs in our runner when
installed (a skipped row with its install hint otherwise), and the windowed ones compute what their
notes say."""

from __future__ import annotations

import pytest
import torch

from attention_zoo import build_attention
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.peers import PEERS, PeerSpec, select_peers
from attention_zoo.measure.peers.lucid import LucidSlidingOptions
from attention_zoo.measure.runner import MeasureSettings, measure_case

LUCID = [
    "lucid:local",
    "lucid:sliding-window",
    "lucid:performer",
    "lucid:linformer",
    "lucid:nystrom",
]
BIDIRECTIONAL_ONLY = {"lucid:linformer", "lucid:nystrom"}
QUICK = MeasureSettings(metrics=("time", "memory"), time_budget_s=0.0, min_repeats=1, warmup=0)


def _case(peer: str, causal: bool) -> BenchCase:
    return BenchCase(
        target="block", backend=peer, mode="forward+backward", hidden=32, num_heads=2,
        head_dim=16, seq_len=96, causal=causal,
    )  # fmt: skip


def test_lucid_family_mirrors_the_backends_measured() -> None:
    assert select_peers(["lucid"], ["sliding-window", "performer"]) == [
        "lucid:sliding-window",
        "lucid:performer",
    ]
    assert {PEERS.get(p).mirrors for p in LUCID} == {
        "local", "sliding-window", "performer", "linformer", "nystrom",
    }  # fmt: skip


@pytest.mark.parametrize("peer", LUCID)
def test_lucid_peer_builds_and_runs_or_says_how_to_install(peer: str) -> None:
    """The quick check: built as the runner builds it, one forward, or the install hint."""
    spec = PEERS.get(peer)
    for causal in (False, True):
        case = _case(peer, causal).replace(seq_len=16)
        reason = spec.unsupported(case)
        if spec.version() is None:
            assert reason == f"{spec.package} is not installed (pip install {spec.package})"
        elif causal and peer in BIDIRECTIONAL_ONLY:
            assert "bidirectional only" in reason
        else:
            assert reason is None
            block = spec.build(case, spec.make_options())
            x = torch.randn(1, 16, case.hidden)
            assert block(x).shape == x.shape


@pytest.mark.slow  # the profiler and the packages' first calls: 1-10 s each
@pytest.mark.parametrize("peer", LUCID)
def test_lucid_peer_runs_in_the_runner_or_says_how_to_install(peer: str) -> None:
    spec = PEERS.get(peer)
    for causal in (False, True):
        result = measure_case(_case(peer, causal), QUICK)
        if spec.version() is None:
            assert result.status == "skipped"
            assert result.error == f"{spec.package} is not installed (pip install {spec.package})"
        elif causal and peer in BIDIRECTIONAL_ONLY:
            assert result.status == "skipped" and "bidirectional only" in result.error
        else:
            assert result.status == "ok", result.error
            assert {r.metric for r in result.rows} >= {"time_median", "peak_bytes"}


@pytest.mark.slow
def test_a_missing_lucid_package_is_a_skipped_row(monkeypatch) -> None:
    monkeypatch.setattr(PeerSpec, "version", lambda self: None)
    result = measure_case(_case("lucid:performer", False), QUICK)
    assert result.status == "skipped"
    assert result.error == "performer-pytorch is not installed (pip install performer-pytorch)"


@pytest.mark.slow
def test_sliding_peer_takes_no_global_tokens() -> None:
    case = _case("lucid:sliding-window", True).replace(options={"global_tokens": 2})
    result = measure_case(case, QUICK)
    assert result.status == "skipped"
    assert "global tokens" in result.error or "pip install" in result.error


@pytest.mark.skipif(PEERS.get("lucid:local").version() is None, reason="local-attention missing")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_local_attention_computes_what_the_notes_say(causal: bool) -> None:
    """local-attention's chunked windows are our exact local's; its exact window of w is our
    sliding window of w + 1 (it sees i - w too). At a length of whole windows: at others its
    bidirectional queries also see the zero keys its autopad appends."""
    from local_attention import LocalAttention

    q, k, v = (torch.randn(2, 3, 48, 16, dtype=torch.float64) for _ in range(3))

    def lucid(window: int, exact: bool) -> torch.Tensor:
        core = LocalAttention(window_size=window, causal=causal, look_backward=1,
                              look_forward=int(not causal), exact_windowsize=exact, autopad=True,
                              use_rotary_pos_emb=False)  # fmt: skip
        return core(q, k, v)

    local = build_attention("local", causal=causal, device="cpu", chunk_length=8,
                            num_chunks_after=int(not causal))  # fmt: skip
    torch.testing.assert_close(lucid(8, exact=False), local(q, k, v), atol=1e-10, rtol=1e-10)
    sliding = build_attention("sliding-window", causal=causal, device="cpu", window=9)
    torch.testing.assert_close(lucid(8, exact=True), sliding(q, k, v), atol=1e-10, rtol=1e-10)


@pytest.mark.skipif(PEERS.get("lucid:local").version() is None, reason="local-attention missing")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_sliding_window_peer_computes_our_band(causal: bool) -> None:
    """lucid:sliding-window built for window 9 computes our sliding-window of 9 (causal: 9 keys,
    bidirectional: 17) at a length of whole windows of its own (48 = 6 x 8)."""
    case = _case("lucid:sliding-window", causal)
    peer = PEERS.get("lucid:sliding-window").build(case, LucidSlidingOptions(window=9))
    q, k, v = (torch.randn(2, 3, 48, 16, dtype=torch.float64) for _ in range(3))
    ours = build_attention("sliding-window", causal=causal, device="cpu", window=9)
    torch.testing.assert_close(peer.attn_fn(q, k, v), ours(q, k, v), atol=1e-10, rtol=1e-10)
