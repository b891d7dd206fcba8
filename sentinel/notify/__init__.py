"""Telling people: who hears of an incident and when, the durable outbox, delivery.

``dispatch`` is the policy between incidents and the ``outbox`` (``outbox_store``, its
table); ``notices`` is what people should hear, as data; ``messages`` (``message_story``,
``message_markup``, ``message_json``) renders it per target style; ``notifier`` and
``outbox_delivery`` deliver through apprise (``apprise_message``, ``retry_after``),
recording ``target_results``; ``heartbeat`` is the dead-man switch; ``settings`` is
``[notify]``.

It may import evidence (a report's words), the store and the model; never a rule.
"""
