"""The KV cache's size as the engine reports it (vLLM cache_config_info), for the efficiency ceiling."""

from __future__ import annotations

from agent.sources.engines.vllm import ADAPTER

PAGE = """\
vllm:generation_tokens_total{engine="0",model_name="llama"} 100.0
vllm:generation_tokens_total{engine="1",model_name="llama"} 50.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="%s"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="%s"} 1.0
"""


def test_blocks_times_block_size_averaged_over_ranks() -> None:
    (m,) = ADAPTER.parse(PAGE % ("27000", "25000"))
    # (27,000 + 25,000) / 2 blocks × 16 tokens per block, per data-parallel rank
    assert m.model == "llama" and m.kv_capacity_tokens == 416_000.0


def test_a_deploy_that_shrinks_the_cache_is_read_as_such() -> None:
    (before,) = ADAPTER.parse(PAGE % ("27000", "27000"))
    (after,) = ADAPTER.parse(PAGE % ("4000", "4000"))
    assert (before.kv_capacity_tokens, after.kv_capacity_tokens) == (432_000.0, 64_000.0)


def test_a_garbled_label_leaves_the_size_absent() -> None:
    (m,) = ADAPTER.parse(PAGE.replace('block_size="16"', 'block_size="x"') % ("27000", "27000"))
    assert m.kv_capacity_tokens is None
