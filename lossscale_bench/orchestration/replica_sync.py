"""Replica synchronisation for data-parallel trials, behind the interface the loop knows.

The training loop (``engine.loop.Trainer``) is handed a ``grad_sync`` object and
calls ``grad_sync(params)`` after unscaling and ``grad_sync.mean(t)`` on the
step's loss values; it never imports torch.distributed glue itself. These are
the objects the multi-device launcher (``distributed``) hands it.
"""

from __future__ import annotations


class GradSync:
    """``grad_sync`` for ``run_trial``: average true (unscaled) gradients across replicas.

    Called by the loop after the scaler's ``unscale_``. Parameters whose gradient
    is None on some replica are given zeros there (one tiny MAX all-reduce of a
    has-gradient mask keeps the flattened buffers the same size everywhere), then
    one flattened SUM all-reduce per (device, dtype) divided by the world size.
    Keeps the last parameter list so the end-of-trial drift check can read it.
    """

    def __init__(self) -> None:
        self.params: list = []
        self.calls = 0

    def __call__(self, params) -> None:
        import torch
        import torch.distributed as dist

        self.params = [p for p in params if p.requires_grad]
        self.calls += 1
        if not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size()
        if world <= 1 or not self.params:
            return
        dev = self.params[0].device
        has = torch.tensor([float(p.grad is not None) for p in self.params], device=dev)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        for p, h in zip(self.params, has.tolist()):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list] = {}
        for p, h in zip(self.params, has.tolist()):
            if h:
                buckets.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in buckets.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n

    def mean(self, t):
        """The loop's replica mean of the step's loss values (see :func:`mean_across_replicas`)."""
        return mean_across_replicas(t)


#: the function name trial.py's docstring uses
allreduce_mean = GradSync


class RecordOnlySync(GradSync):
    """For XLA replicas: ``xm.optimizer_step`` already averages gradients; only remember the parameters.

    Passing it (rather than None) still tells the loop the trial is data-parallel:
    gradients are unscaled before the optimizer step, the drift check sees the weights.
    """

    def __call__(self, params) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.calls += 1


def mean_across_replicas(t):
    """Mean of tensor ``t`` over the data-parallel replicas (``t`` itself when not distributed).

    For the loop: all-reducing the step's loss (and its parts) makes the logged
    loss the replicas' mean and every divergence decision the same on all replicas.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t
