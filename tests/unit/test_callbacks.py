"""The rollout-sample callback writes decoded episodes to TensorBoard's text tab on its period, and only then."""

from __future__ import annotations

from types import SimpleNamespace

from callbacks.rollout_samples import RolloutSampleLogger, render_episode
from envace.types import Episode, ExpectedAnswer, Role, Sample, SuccessSpec, Task


class _Experiment:
    def __init__(self) -> None:
        self.texts: list[tuple[str, str, int]] = []

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.texts.append((tag, text, step))


def _episode() -> Episode:
    task = Task("t1", ({"role": "user", "content": "Balance of A1?"},), (), SuccessSpec(answer=ExpectedAnswer("5")))
    messages = [
        {"role": "user", "content": "Balance of A1?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}]},
        {"role": "tool", "name": "get_balance", "content": '{"balance": 5}'},
        {"role": "assistant", "content": "5"},
    ]
    act = Sample([1, 2], [int(Role.USER), int(Role.ACT)], [0, 1], Role.ACT, 0, 0)
    return Episode(task=task, group_index=0, messages=messages, act=act, final_answer="5", reward=1.0, success=True)


def test_render_episode_shows_calls_responses_and_reward() -> None:
    text = render_episode(_episode())
    assert '"name": "get_balance"' in text and 'tool[get_balance]: {"balance": 5}' in text
    assert "**reward** 1.000" in text and "**success** True" in text


def test_logger_writes_on_its_period_only(monkeypatch) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    experiment = _Experiment()
    logger = TensorBoardLogger.__new__(TensorBoardLogger)
    monkeypatch.setattr(TensorBoardLogger, "experiment", property(lambda self: experiment))
    module = SimpleNamespace(last_episodes=[_episode(), _episode(), _episode()])
    callback = RolloutSampleLogger(every_n_steps=5, num_episodes=2)
    for step in (4, 5, 6, 10):
        trainer = SimpleNamespace(global_step=step, is_global_zero=True, loggers=[logger])
        callback.on_train_batch_end(trainer, module, None, None, 0)
    assert [(tag, step) for tag, _, step in experiment.texts] == [
        ("rollouts/episode_0", 5), ("rollouts/episode_1", 5), ("rollouts/episode_0", 10), ("rollouts/episode_1", 10)
    ]
