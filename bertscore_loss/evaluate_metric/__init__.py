"""The ``evaluate`` metric module of this library: ``evaluate.load(bertscore_loss.compat.evaluate_module_path())``.

The module file (:mod:`bertscore_loss.evaluate_metric.bertscore_loss_metric`) needs the extra ``evaluate``;
this package imports nothing, so ``import bertscore_loss`` never needs it.
"""
