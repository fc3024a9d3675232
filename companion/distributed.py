"""Training on several processes with ``DistributedDataParallel`` (chapter 8's command line
under ``torchrun --nproc_per_node=N``).

- :func:`init_distributed` joins the process group ``torchrun`` describes in the environment
  (NCCL on GPUs, gloo on CPUs) and picks this process's device;
- :func:`rank_and_world` is this process's rank and the number of processes (``0, 1``
  outside a group);
- :func:`whole_batch_loss` is what :func:`companion.train.train_step` needs to train on a
  share of every batch: it weights this process's loss so that the gradient
  ``DistributedDataParallel`` averages is exactly that of the whole batch's mean loss, and
  returns the whole batch's loss and token count for the logs.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["init_distributed", "rank_and_world", "whole_batch_loss"]


def init_distributed(device: str | torch.device | None) -> tuple[torch.device, bool]:
    """Start the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).

    Returns the device of this process (default ``cuda:LOCAL_RANK`` when CUDA is available,
    else ``cpu``) and whether this call started the group (then the caller also ends it with
    ``dist.destroy_process_group()``). Backend: NCCL on GPUs, gloo on CPUs.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    started = False
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started = True
    return device, started


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes: ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def whole_batch_loss(loss: Tensor, tokens: Tensor | int) -> tuple[Tensor, Tensor, Tensor]:
    """This process's share of a batch → the loss to back-propagate and the whole batch's
    figures (a collective call: every process of the group makes it).

    Args:
        loss: ``()``, the mean loss over this process's ``tokens`` target tokens.
        tokens: ``()`` or an int, this process's non-padding target tokens.

    Returns:
        ``(weighted, batch_loss, batch_tokens)``: ``loss`` times ``world_size · tokens /
        batch_tokens``, whose gradient ``DistributedDataParallel`` averages over the processes
        into exactly the gradient of the whole batch's mean loss; the whole batch's mean loss
        (detached, ``()``) and its target tokens (``()``).
    """
    tokens = torch.as_tensor(tokens, device=loss.device)
    totals = torch.stack([loss.detach() * tokens, tokens.to(loss.dtype)])  # (2,)
    dist.all_reduce(totals)  # (2,): summed over processes
    batch_loss, batch_tokens = totals[0] / totals[1], totals[1]
    weight = tokens * dist.get_world_size() / batch_tokens
    return loss * weight, batch_loss, batch_tokens
