"""Each infiller's rule on a scripted model (hand-made logits)."""

from refusion.decoding.decoder import Decoder
from refusion.testing import ScriptedModel, one_hot_logits

V, MASK = 12, 11


def scripted(mask_rule, clean_rule, eos=None):
    """mask_rule(seen, p) -> (token, prob); clean_rule(p, token) -> (next token, prob)."""

    def rule(seen, position, token):
        if token == MASK:
            t, p = mask_rule(seen, position)
        else:
            t, p = clean_rule(position, token)
        return one_hot_logits(V, t, p)

    return ScriptedModel(rule, vocab_size=V, mask_token_id=MASK, eos_token_id=eos)


DRAFT = {1: 3, 2: 4, 3: 5, 4: 6}


def paper(**kw):
    params = dict(slot_size=2, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9)
    params.update(kw)
    return Decoder.from_names(**params)


def test_global_verification_commits_all_chosen_slots_in_one_pass():
    model = scripted(lambda seen, p: (DRAFT[p], 0.95), lambda p, t: (DRAFT.get(p + 1, 0), 0.99))
    result = paper().decode(model, [0], 4, record=True)
    assert result.tokens.tolist() == [3, 4, 5, 6]
    (step,) = result.iterations
    assert step.selected == (0, 1)
    assert step.committed == ((0, 2), (1, 2))
    assert step.forwards == 2  # the plan (with the prompt prefill) and the global verification


def test_global_verification_commits_only_whole_verified_slots():
    def low_at_4(p, t):
        return DRAFT.get(p + 1, 0), 0.3 if p + 1 == 4 else 0.99

    model = scripted(lambda seen, p: (DRAFT[p], 0.95), low_at_4)
    result = paper().decode(model, [0], 4, record=True)
    assert result.tokens.tolist() == [3, 4, 5, 6]
    first, second = result.iterations
    assert first.committed == ((0, 2),)  # slot 1 was verified only up to its forced first token
    assert second.selected == (1,)
    assert second.committed == ((1, 2),)
    assert second.forwards == 4  # plan, global verification, one draft + verify round


def test_parallel_round_accepts_forced_token_plus_confident_run():
    probs = {1: 0.3, 2: 0.95, 3: 0.3}  # AR confidence of the token after position p
    model = scripted(lambda seen, p: (DRAFT[p], 0.95), lambda p, t: (DRAFT.get(p + 1, 0), probs.get(p, 0.3)))
    result = paper(slot_size=4).decode(model, [0], 4, record=True)
    assert result.tokens.tolist() == [3, 4, 5, 6]
    (step,) = result.iterations
    assert step.forwards == 6  # plan, global verification, 2 rounds of draft + verify
    positions, tokens = model.calls[-1][0]
    assert (positions[:2], tokens[:2]) == ([3, 4], [5, 6])  # round 1 accepted positions 1-3; only 3..4 are fed again


def test_parallel_branches_are_independent_of_each_other():
    # Two chosen slots; slot 0 needs two rounds, slot 1 one. Branch 1 is not fed again in round 2.
    drafts = {1: 3, 2: 4, 3: 5, 4: 6, 5: 7, 6: 8}
    probs = {1: 0.3, 2: 0.3, 3: 0.3, 4: 0.3, 5: 0.95}  # slot 1 completes in round 1
    model = scripted(
        lambda seen, p: (drafts[p], 0.95 if p in (1, 4) else 0.5),
        lambda p, t: (drafts.get(p + 1, 0), probs.get(p, 0.3)),
    )
    result = paper(slot_size=3).decode(model, [0], 6, record=True)
    first = result.iterations[0]
    assert first.selected == (0, 1)
    assert [c for c, _ in first.committed] == [0, 1]
    fed = [sorted(p for positions, _ in call for p in positions) for call in model.calls]
    # round 1 (draft, verify) feeds both branches in one call; round 2 only slot 0's unverified tail
    assert fed[2] == fed[3] == [1, 2, 3, 4, 5, 6]
    assert fed[4] == fed[5] == [2, 3]
    assert result.tokens.tolist() == [3, 4, 5, 6, 7, 8]


def ar_next(position, token):
    return (3 * token + position) % 10


def test_greedy_verify_equals_ar_under_wrong_drafts():
    model = scripted(lambda seen, p: ((p * 7) % 10, 0.6), lambda p, t: (ar_next(p, t), 0.8))
    result = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=4, serial_num_blocks=1).decode(
        model, [0], 8, record=True
    )
    expected, token = [], 0
    for position in range(0, 8):
        token = ar_next(position, token)
        expected.append(token)
    assert result.tokens.tolist() == expected


def test_greedy_verify_keeps_only_matching_drafts():
    # Drafts equal the AR continuation: one verification pass accepts the whole slot.
    seq = {1: 1, 2: 2, 3: 3, 4: 4}
    model = scripted(lambda seen, p: (seq[p], 0.6), lambda p, t: (seq.get(p + 1, 5), 0.8))
    result = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=4, serial_num_blocks=1).decode(
        model, [0], 4, record=True
    )
    assert result.tokens.tolist() == [1, 2, 3, 4]
    assert result.iterations[0].forwards == 2  # plan + one verification


def test_eos_truncates_the_slot_and_drops_later_slots():
    eos = 2
    drafts = {1: 3, 2: eos, 3: 5, 4: 6}
    model = scripted(lambda seen, p: (drafts[p], 0.95), lambda p, t: (drafts.get(p + 1, 0), 0.99), eos=eos)
    result = paper(slot_size=4, serial_num_blocks=1).decode(model, [0], 4, record=True)
    assert result.tokens.tolist() == [3, eos]
    assert result.stopped_at_eos
    assert result.commit_step.tolist() == [0, 0, -1, -1]


def test_leftmost_plans_draft_only_the_slot_it_can_pick():
    model = scripted(lambda seen, p: (DRAFT.get(p, 1), 0.6), lambda p, t: (DRAFT.get(p + 1, 5), 0.8))
    decoder = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", slot_size=2, serial_num_blocks=1, adaptive=False
    )
    decoder.decode(model, [0], 4, record=True)
    plans = [call for call in model.calls if all(t == MASK for _, tokens in call for t in tokens)]
    assert plans and all(len(positions) == 2 for call in plans for positions, _ in call)  # one slot of 2, not 2 slots


def test_adaptive_greedy_verify_falls_back_to_ar_steps_and_skips_unread_plans():
    # Drafts are always wrong: after the first slot the infiller feeds no drafts, so the plans are skipped.
    model = scripted(lambda seen, p: (9, 0.6), lambda p, t: (ar_next(p, t), 0.8))
    adaptive = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=4, serial_num_blocks=1)
    jacobi = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", slot_size=4, serial_num_blocks=1, adaptive=False
    )
    fast, plain = adaptive.decode(model, [0], 16, record=True), jacobi.decode(model, [0], 16, record=True)
    expected, token = [], 0
    for position in range(16):
        token = ar_next(position, token)
        expected.append(token)
    assert fast.tokens.tolist() == plain.tokens.tolist() == expected  # lossless either way
    assert fast.fed_tokens < plain.fed_tokens
    assert fast.forwards <= 16 + 2  # about one AR step per token, plus the first slot's plan and probe
    assert fast.forwards <= plain.forwards + 2  # the same steps, without re-feeding wrong drafts
