"""Registers the tasks that ship with the project (imported lazily by ``tasks``)."""

from specdec_jax.data import tasks, text_tasks
from specdec_jax.data.humaneval import humaneval_task

tasks.register("humaneval", humaneval_task)
text_tasks.register_all()
