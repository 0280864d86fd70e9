"""RayBeast: actors are Ray actors; rollouts and weights move through Ray's object store.

    Ray actor i (a process, on any node)           driver: the learner
    ------------------------------------           -------------------
    E envs, a CPU model copy                       RayActorPool keeps TASKS_PER_ACTOR unroll
    unroll(weights, version):        <-- task --     tasks in flight per actor; a collector
      load the weights if newer                      thread waits for finished ones (ray.wait),
      step E envs T times, batched                   queues their E columns and asks again
      return arrays [E, T+1, ...]    -- object -->   learner threads: stack B columns, learn
                                                     publish: one ray.put per update

An actor that dies (its process killed, its node lost) fails its tasks with a
RayActorError; the collector starts a new actor in its place and asks it for rollouts.
``prepare`` sets what Ray reads from the environment when it is first imported; the
other modules import Ray, so the registry imports them (``trainer``) only after it.
This package's ``__init__`` imports nothing: ``prepare`` must run before Ray is imported.
"""
