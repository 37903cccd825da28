"""Input staging on the CPU (Backend::stage_inputs): the reference the CUDA kernel is held to.

Each of ids, mask and types in int32, int64, uint8 or bool, random lengths, bad values of every
kind: the staged int32 arrays hold every good value and 0 for a bad one, and the recorded value is
the first bad one in order (ids, then types, then mask at one position)."""

import itertools

import numpy as np
import pytest

from ftbert import _ops
from tests._inputs import DTYPES, random_inputs, staged_reference

VOCAB, TYPE_VOCAB = 250, 3


@pytest.fixture(scope="module")
def cpu():
    return _ops.OpRunner("cpu")


def first_bad(ids, mask, types):
    for k in range(len(ids)):
        for field, a, ok in ((1, ids, lambda v: 0 <= v < VOCAB), (2, types, lambda v: 0 <= v < TYPE_VOCAB),
                             (3, mask, lambda v: v in (0, 1))):
            v = int(a[k])
            if not ok(v):
                return field, v
    return None


@pytest.mark.parametrize("dtypes", list(itertools.product(DTYPES, repeat=3)),
                         ids=lambda d: "-".join(np.dtype(x).name for x in d))
@pytest.mark.parametrize("bad", [(0, 0, 0), (1, 0, 0), (0, 2, 0), (0, 0, 3), (4, 3, 2)])
def test_stage_inputs_matches_the_reference(cpu, rng, dtypes, bad):
    n = int(rng.integers(1, 300))
    ids, mask, types = random_inputs(rng, n, VOCAB, TYPE_VOCAB, dtypes, *bad)
    got_ids, got_mask, got_types, recorded = cpu.stage_inputs(ids, mask, types, VOCAB, TYPE_VOCAB)
    (want_ids, want_mask, want_types), bad_values = staged_reference(ids, mask, types, VOCAB, TYPE_VOCAB)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_mask, want_mask)
    np.testing.assert_array_equal(got_types, want_types)
    assert recorded == first_bad(*(np.asarray(a).astype(np.int64) for a in (ids, mask, types)))
    assert (recorded is None) == (not bad_values)


def test_stage_inputs_of_nothing(cpu):
    empty = np.zeros(0, np.int64)
    ids, mask, types, recorded = cpu.stage_inputs(empty, empty, empty, VOCAB, TYPE_VOCAB)
    assert ids.size == mask.size == types.size == 0 and recorded is None
