"""'auto': the compression method a profile calls for, and why."""

from __future__ import annotations

import logging

from hetflow.records import CompressionMethod

log = logging.getLogger(__name__)

# The communication share of a step from which 'auto' compresses, tuned with `hetflow bench
# comm` (measured: docs/measurements.md).
COMPRESS_ABOVE = 0.40
STRONG_METHOD = CompressionMethod(name="powersgd", rank=4)


def choose_compression(
    comm_share: float, threshold: float = COMPRESS_ABOVE
) -> tuple[CompressionMethod, str]:
    """'auto': compress only when communication is a large share of the step; say why (the
    reason is also logged).

    `comm_share` is the profiled all-reduce time of one gradient over (compute + all-reduce).
    Below `threshold` nothing is compressed: the saving is at most that share and compression
    costs compute and some accuracy. From there on PowerSGD rank 4, which sends far fewer bytes
    than all-reduce at an accuracy close to it.
    """
    if comm_share < threshold:
        method = CompressionMethod(name="none")
        reason = (
            f"measured communication is {comm_share:.0%} of the step (< {threshold:.0%}): "
            "compression would cost compute and accuracy for little time"
        )
    else:
        method = STRONG_METHOD
        reason = (
            f"communication is {comm_share:.0%} of the step (>= {threshold:.0%}): "
            "PowerSGD rank 4 cuts the bytes by >8x"
        )
    log.info("compression 'auto' -> %s: %s", method, reason)
    return method, reason
