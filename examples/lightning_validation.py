"""Log BERTScore every validation epoch with ``bertscore_loss.lightning.BERTScoreMetric`` (LightningCLI).

    python examples/lightning_validation.py fit --config configs/lightning_validation.yaml
    python examples/lightning_validation.py fit --config configs/lightning_validation.yaml \\
        --data.val_cands ../shared/data/wmt16-daseg/DAseg.newstest2016.mt-system.de-en \\
        --data.val_refs '[../shared/data/wmt16-daseg/DAseg.newstest2016.reference.de-en]' \\
        --trainer.devices 2 --trainer.strategy ddp

``ToyTranslator`` stands in for a text generator: its ``generate()`` returns the validation set's system
outputs (replace it with your model's decoding); its trainable part is a small regression so that ``fit``
has something to optimise. The metric shows the intended wiring:

* ``validation_step`` calls ``update(predictions, references, index=...)``: the batch is encoded and
  scored on this rank at once, only scores are kept;
* ``on_validation_epoch_end`` logs the means and resets the metric (``compute`` syncs across ranks);
* with ``per_sample=True`` and the dataset ``index``, duplicates that Lightning's ``DistributedSampler``
  pads into the last batches under DDP are dropped, so the DDP means equal one process's means;
* references are cached across epochs (``ref_cache_bytes``), so epochs 2+ encode only the predictions;
* the validation and test metrics share one encoder, which is in no ``state_dict`` or optimizer.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bertscore_loss.lightning import BERTScoreMetric
from bertscore_loss.textio import read_lines  # lines end at \n or \r\n only; a BOM is dropped

EXAMPLE_DATA = Path(__file__).resolve().parent / "data"


class PairDataset(Dataset):
    """``{"index", "prediction", "references"}`` items: a system output and its reference(s)."""

    def __init__(self, cands: list[str], refs: list[list[str]]) -> None:
        if len(refs) != len(cands):
            raise ValueError(f"{len(cands)} candidates but {len(refs)} reference lists")
        self.cands, self.refs = cands, refs

    def __len__(self) -> int:
        return len(self.cands)

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "prediction": self.cands[i], "references": self.refs[i]}


def collate_pairs(items: list[dict]) -> dict:
    return {
        "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
        "prediction": [it["prediction"] for it in items],
        "references": [it["references"] for it in items],
    }


class RandomRegression(Dataset):
    def __init__(self, n: int, dim: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, dim, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class PairDataModule(pl.LightningDataModule):
    """Validation (and test) pairs from text files, one sentence per line; several ``val_refs`` files = multi-ref.

    ``val_cands``/``val_refs`` default to ``examples/data`` (20 WMT16 de-en pairs).
    """

    def __init__(
        self,
        val_cands: str | None = None,
        val_refs: list[str] | None = None,
        limit: int | None = None,
        batch_size: int = 32,
        train_size: int = 256,
        hidden: int = 16,
    ) -> None:
        super().__init__()
        self.val_cands = val_cands or str(EXAMPLE_DATA / "cands.txt")
        self.val_refs = val_refs or [str(EXAMPLE_DATA / "refs.txt")]
        self.limit, self.batch_size, self.train_size, self.hidden = limit, batch_size, train_size, hidden

    def setup(self, stage: str) -> None:
        cands = read_lines(self.val_cands)[: self.limit]
        ref_files = [read_lines(p)[: self.limit] for p in self.val_refs]
        for path, lines in zip(self.val_refs, ref_files):
            if len(lines) != len(cands):
                raise ValueError(f"{self.val_cands} has {len(cands)} lines but {path} has {len(lines)}")
        self.pairs = PairDataset(cands, [list(g) for g in zip(*ref_files)])
        self.train = RandomRegression(self.train_size, self.hidden)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.pairs, batch_size=self.batch_size, collate_fn=collate_pairs)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class ToyTranslator(pl.LightningModule):
    """A stand-in generator with BERTScore validation; ``bertscore_*`` arguments configure the metric."""

    def __init__(
        self,
        hidden: int = 16,
        lr: float = 0.01,
        bertscore_model: str | None = None,
        bertscore_layer: int | None = None,
        idf_corpus: str | None = None,
        rescale: bool = False,
        baseline: str | None = None,
        ref_cache_bytes: int = 256 << 20,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(hidden, hidden)
        settings = dict(
            idf=idf_corpus is not None,
            idf_corpus=idf_corpus,
            rescale=rescale,
            baseline=baseline,
            per_sample=True,
            ref_cache_bytes=ref_cache_bytes,
        )
        # Same settings: both metrics use one encoder (loaded once per process).
        self.val_bertscore = BERTScoreMetric(bertscore_model, bertscore_layer, **settings)
        self.test_bertscore = BERTScoreMetric(bertscore_model, bertscore_layer, **settings)

    def generate(self, batch: dict) -> list[str]:
        """Your model's decoding goes here; the stand-in returns the dataset's system outputs."""
        return batch["prediction"]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_bertscore.update(self.generate(batch), batch["references"], index=batch["index"])

    def on_validation_epoch_end(self) -> None:
        self._log_metric(self.val_bertscore, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.test_bertscore.update(self.generate(batch), batch["references"], index=batch["index"])

    def on_test_epoch_end(self) -> None:
        self._log_metric(self.test_bertscore, "test")

    def _log_metric(self, metric: BERTScoreMetric, stage: str) -> None:
        scores = metric.compute()  # already synced across ranks: identical on every rank
        # sync_dist=True only averages these identical values (and keeps Lightning from warning).
        self.log_dict({f"{stage}/bertscore_{k}": v.mean() for k, v in scores.items()}, prog_bar=True, sync_dist=True)
        metric.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(args: list[str] | None = None) -> LightningCLI:
    return LightningCLI(ToyTranslator, PairDataModule, args=args)


if __name__ == "__main__":
    main()
