"""Drafting as steps (`spec_zoo.lockstep`): the same generator run alone, relayed through a policy's
steps, or beside others in lockstep gets the same answers and returns the same result; asks of one
server are answered in one call, in order."""

from spec_zoo.lockstep import answer, answer_all, drive, relay, together


class Doubler:
    """A server that doubles what it is asked, and counts its calls and the asks per call."""

    def __init__(self):
        self.calls: list[int] = []

    def together(self, asks):
        self.calls.append(len(asks))
        return [2 * ask.value for ask in asks]


class Ask:
    def __init__(self, server, value):
        self.server, self.value = server, value


def doubling(server, values):
    """Steps that ask the server for each value in turn and return the answers' sum."""
    total = 0
    for value in values:
        total += yield Ask(server, value)
    return total


def test_alone_and_together_give_each_generator_its_own_answers():
    server = Doubler()
    values = [[1, 2, 3], [10], [], [5, 6]]
    alone = [drive(doubling(server, v), answer) for v in values]
    assert alone == [12, 20, 0, 22] and server.calls == [1] * 6
    server.calls.clear()
    assert together([doubling(server, v) for v in values]) == alone
    assert server.calls == [3, 2, 1]  # each round one call for every generator still asking


def test_asks_of_two_servers_are_answered_one_call_per_server_in_order():
    first, second = Doubler(), Doubler()
    asks = [Ask(first, 1), Ask(second, 2), Ask(first, 3)]
    assert answer_all(asks) == [2, 4, 6]
    assert first.calls == [2] and second.calls == [1]


def test_a_relayed_policy_gets_the_drafters_answers_and_its_calls_go_out():
    """A policy's asks (what to expand) answered by steps of the drafter's own (a model call each)."""
    server = Doubler()

    def policy():
        return (yield "a") + (yield "bb")

    def serve(ask):
        return (yield Ask(server, len(ask)))

    assert drive(relay(policy(), serve), answer) == 2 + 4
    assert together([relay(policy(), serve), relay(policy(), serve)]) == [6, 6] and server.calls[-2:] == [2, 2]


def test_enter_and_leave_wrap_every_advance_of_each_generator():
    server, log = Doubler(), []
    together([doubling(server, [1, 2]), doubling(server, [3])], enter=lambda i: log.append(("in", i)),
             leave=lambda i: log.append(("out", i)))
    # every advance of a generator (its start and each answer sent) between its own enter and leave
    assert log == [("in", 0), ("out", 0), ("in", 1), ("out", 1)] * 2 + [("in", 0), ("out", 0)]
