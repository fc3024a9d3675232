"""companion.baselines: the Kneser-Ney trigram against a hand computation, probabilities that
sum to 1, the neighbour guesser's two rules, bad input; companion.data.induction's rows."""

import math

import pytest
import torch

from companion.baselines import KneserNey, KneserNeyTrigram, NeighbourGuesser
from companion.data.induction import repeated_segments

# ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then the words a = 4, b = 5, c = 6
A, B, C, EOS, BOS = 4, 5, 6, 2, 1
TINY = [[A, B], [A, C], [B, C]]  # read as <bos> a b <eos>, <bos> a c <eos>, <bos> b c <eos>
VOCAB = 7  # outcomes: every id but <pad>, <bos>: 5


def test_kneser_ney_by_hand():
    kn = KneserNeyTrigram(TINY, VOCAB)
    D = 0.5
    # unigram continuation counts N1+(. w) over the bigram types
    # (bos a) (a b) (b eos) (a c) (c eos) (bos b) (b c): a 1, b 2, c 2, eos 2; 7 types, 4 words
    p1 = {w: (max(n - D, 0) + D * 4 / 5) / 7 for w, n in {A: 1, B: 2, C: 2, EOS: 2, 3: 0}.items()}
    assert math.isclose(kn.probability(3, (A,), D), 0 + D * 2 * p1[3] / 2)  # <unk> after a: no pair
    # after <bos>: plain counts (nothing precedes <bos>): a 2, b 1; total 3, 2 types
    p2_a_after_bos = (2 - D + D * 2 * p1[A]) / 3
    assert math.isclose(kn.probability(A, (BOS,), D), p2_a_after_bos)
    # the bigram level after a: continuation counts n(a b) = 1 (bos before), n(a c) = 1; total 2
    p2_b_after_a = (1 - D + D * 2 * p1[B]) / 2
    # the trigram (bos, a): seen twice, followed by b once and c once
    p3 = (1 - D + D * 2 * p2_b_after_a) / 2
    assert math.isclose(kn.probability(B, (BOS, A), D), p3)
    # an unseen trigram context falls back to the bigram level: (c, a) never occurs
    assert math.isclose(kn.probability(B, (C, A), D), p2_b_after_a)
    # the perplexity of one sentence by hand: <bos> a b <eos>
    p_eos = kn.probability(EOS, (A, B), D)
    expected = math.exp(-(math.log(p2_a_after_bos) + math.log(p3) + math.log(p_eos)) / 3)
    assert math.isclose(kn.perplexity([[A, B]], D), expected)


@pytest.mark.parametrize("discount", [0.0, 0.3, 0.75, 1.0])
def test_kneser_ney_sums_to_one_in_every_context(discount):
    generator = torch.Generator().manual_seed(0)
    train = [torch.randint(3, 12, (int(n),), generator=generator).tolist()
             for n in torch.randint(1, 8, (40,), generator=generator)]  # fmt: skip
    kn = KneserNeyTrigram(train, 12)
    outcomes = [w for w in range(12) if w not in (0, 1)]
    for context in [(BOS,), (BOS, 5), (5, 7), (7, 7), (11, 3), (4,), (2, 9)]:
        total = sum(kn.probability(w, context, discount) for w in outcomes)
        assert math.isclose(total, 1.0, rel_tol=1e-9), (context, total)


def test_kneser_ney_beats_add_k_on_held_out_text():
    from companion.data import ngram_perplexity

    generator = torch.Generator().manual_seed(1)

    def sentence():  # a noisy grammar: the next word depends on the last two
        words = [4, 5]
        for _ in range(6):
            words.append(
                4
                + (words[-1] + words[-2] + int(torch.randint(0, 3, (1,), generator=generator))) % 8
            )
        return words

    train, held_out = [sentence() for _ in range(300)], [sentence() for _ in range(100)]
    kn = KneserNeyTrigram(train, 12).perplexity(held_out)
    assert kn < ngram_perplexity(train, held_out, 2, 0.01, vocab_size=12)


def test_kneser_ney_bad_input():
    with pytest.raises(TypeError, match="train must be a list of sentences"):
        KneserNeyTrigram("a b", VOCAB)
    with pytest.raises(ValueError, match=r"train\[0\] must hold ids"):
        KneserNeyTrigram([[BOS, A]], VOCAB)
    kn = KneserNeyTrigram(TINY, VOCAB)
    with pytest.raises(ValueError, match="discount must be in"):
        kn.probability(A, (BOS,), 1.5)
    with pytest.raises(ValueError, match="context must hold 1 or 2 ids"):
        kn.probability(A, (), 0.5)
    with pytest.raises(ValueError, match="word must be an id"):
        kn.probability(BOS, (A,), 0.5)
    with pytest.raises(ValueError, match="at least one sentence"):
        kn.perplexity([])


def test_neighbour_guesser_uses_the_triple_then_the_bigram_posterior():
    # a between <bos> and b: "<bos> a b" twice, "<bos> c b" once: the triple count wins
    train = [[A, B], [A, B], [C, B], [C, A]]
    guesser = NeighbourGuesser(train, VOCAB, special_ids=(0, 1, 2, 3))
    assert guesser.guess(BOS, B) == A
    # (a, ?, <eos>) never occurs: P(w | a) P(<eos> | w) decides; a is followed by b only,
    # (twice of three) and b always ends its sentence
    assert guesser.guess(A, EOS, k=0.01) == B
    score = guesser.scores(A, EOS, k=0.0)
    assert score[B] > 0 and (score[[0, 1, 2, 3]] == 0).all()
    assert math.isclose(float(score[B]), (2 / 3) * (3 / 3))  # P(b | a) = 2/3, P(<eos> | b) = 3/3


def test_neighbour_guesser_drops_a_hidden_neighbour():
    MASK = 3
    train = [[A, B], [A, B], [C, B], [C, A]]
    guesser = NeighbourGuesser(train, VOCAB, special_ids=(0, 1, 2, MASK))
    # left neighbour hidden: P(w) · P(b | w); only a is ever followed by b
    assert guesser.guess(MASK, B) == A
    with pytest.raises(TypeError, match="left must be an int id"):
        guesser.guess(torch.tensor(1), B)
    with pytest.raises(ValueError, match="right must be an id"):
        guesser.guess(A, 99)


def test_repeated_segments():
    rows, lengths = repeated_segments(64, 20, 16, torch.Generator().manual_seed(0), min_segment=3)
    assert rows.shape == (64, 20) and lengths.shape == (64,)
    assert lengths.min() >= 3 and lengths.max() <= 10 and len(set(lengths.tolist())) > 4
    assert rows.min() >= 1 and rows.max() < 16
    for row, n in zip(rows, lengths.tolist()):
        assert torch.equal(row[n : 2 * n], row[:n])
    again, _ = repeated_segments(64, 20, 16, torch.Generator().manual_seed(0), min_segment=3)
    assert torch.equal(rows, again)
    with pytest.raises(ValueError, match="seq_len"):
        repeated_segments(2, 5, 16, torch.Generator(), min_segment=3)
    with pytest.raises(TypeError, match="generator"):
        repeated_segments(2, 8, 16, 0)


def test_kneser_ney_of_order_3_is_the_trigram_and_higher_orders_sum_to_1():
    """KneserNey(order=3) gives KneserNeyTrigram's probabilities; every order is a distribution."""
    g = torch.Generator().manual_seed(0)
    train = [
        torch.randint(3, 12, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 9, (60,), generator=g)
    ]
    test = [torch.randint(3, 12, (5,), generator=g).tolist() for _ in range(10)]
    trigram, general = KneserNeyTrigram(train, 12), KneserNey(train, 12, 3)
    for d in (0.1, 0.75, 1.0):
        assert math.isclose(general.perplexity(test, d), trigram.perplexity(test, d), rel_tol=1e-12)
    for order in (1, 2, 4, 5):
        model = KneserNey(train, 12, order)
        for context in [(BOS,), (BOS, 4), (5, 6, 7, 8), (11, 11, 11)]:
            total = sum(model.probability(w, context, 0.7) for w in range(2, 12))
            assert math.isclose(total, 1.0, rel_tol=1e-12), (order, context, total)


def test_kneser_ney_rejects_bad_input():
    with pytest.raises(ValueError, match="order"):
        KneserNey(TINY, VOCAB, 0)
    model = KneserNey(TINY, VOCAB, 4)
    with pytest.raises(ValueError, match="discount"):
        model.probability(A, (BOS,), 1.5)
    with pytest.raises(ValueError, match="word"):
        model.probability(BOS, (BOS,), 0.5)


def test_modified_kneser_ney_by_hand_and_sums_to_1():
    """modified=True: three closed-form discounts per order, applied by count; a distribution."""
    g = torch.Generator().manual_seed(2)
    zipf = 1 / torch.arange(1.0, 18.0)  # ids 3..19, word k drawn in proportion to 1/k
    train = [
        (3 + torch.multinomial(zipf, int(n), replacement=True, generator=g)).tolist()
        for n in torch.randint(1, 9, (300,), generator=g)
    ]
    model = KneserNey(train, 20, 3, modified=True)
    plain = KneserNey(train, 20, 3)
    for m in (2, 3):  # the discounts from the count-of-counts of each order, by hand
        n = [
            sum(1 for gram, c in model.count[m].items() if c == k and gram[-1] != BOS)
            for k in range(5)
        ]
        assert min(n[1:]) > 0, n  # every estimate defined
        y = n[1] / (n[1] + 2 * n[2])
        expected = [min(max(k - (k + 1) * y * n[k + 1] / n[k], 0), k) for k in (1, 2, 3)]
        assert all(math.isclose(a, b) for a, b in zip(model.discounts[m], expected)), (
            m,
            model.discounts[m],
        )
    assert all(0 <= d <= k for k, d in enumerate(model.discounts[1], start=1)), model.discounts[1]
    d1, d2, d3 = model.discounts[3]
    # one trigram probability by hand: the context's counts, the discount by the count seen
    history = next(h for h, t in model.total[3].items() if t >= 5)
    word = max(range(2, 20), key=lambda w: model.count[3].get((*history, w), 0))
    c, total = model.count[3][(*history, word)], model.total[3][history]
    seen_counts = [model.count[3].get((*history, w), 0) for w in range(2, 20)]
    n1, n2, n3 = seen_counts.count(1), seen_counts.count(2), sum(k >= 3 for k in seen_counts)
    lower = model.probability(word, history[1:])  # the bigram level, itself modified
    by_hand = (c - (d1, d2, d3)[min(c, 3) - 1]) / total + (
        d1 * n1 + d2 * n2 + d3 * n3
    ) / total * lower
    assert math.isclose(model.probability(word, history), by_hand, rel_tol=1e-12)
    for scale in (0.5, 1.0):
        for context in [(BOS,), (BOS, 4), (5, 6), (8, 8), (3, 7)]:
            total = sum(model.probability(w, context, scale) for w in range(2, 20))
            assert math.isclose(total, 1.0, rel_tol=1e-12), (scale, context, total)
    # the default is unchanged: one D = 0.75, and modified=True differs from it
    assert plain.perplexity(train[:10]) == plain.perplexity(train[:10], 0.75)
    assert model.perplexity(train[:10]) != plain.perplexity(train[:10])


def test_modified_kneser_ney_rejects_bad_input():
    model = KneserNey(TINY * 3, VOCAB, 2, modified=True)
    with pytest.raises(ValueError, match="exceed"):
        model.probability(A, (BOS,), 10.0)
    with pytest.raises(TypeError, match="modified"):
        KneserNey(TINY, VOCAB, 2, modified=1)
