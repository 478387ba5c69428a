"""``python -m rl.train`` with the tests' own tasks registered (``low_tokens``,
``search_qa_scripted``): what the multi-process tests start as subprocesses."""

import sys

import tests.rl.run.test_trainer  # noqa: F401  (registers low_tokens)
from rl.run.wiring import TASKS
from rl.train import main
from tests.paths import CONF


def _scripted_search_qa(**kw):
    # imported when the task is built, after the job is joined: importing bm25s runs JAX
    from tests.rl.rewarders.test_arbor_e2e import ScriptedSearchQATask

    return ScriptedSearchQATask(**kw)


if __name__ == "__main__":
    TASKS.register("search_qa_scripted")(_scripted_search_qa)
    sys.argv[1:1] = ["--config-path", str(CONF)]  # hydra looks beside __main__ otherwise
    main()
