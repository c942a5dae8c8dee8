"""Writes and reads of machines and the accounts that provision them.

``instances`` is the only writer of ``Instance.status``; ``accounts`` builds a
backend per connected account; ``offers`` ranks offers across them;
``reconcile`` compares what the clouds say with the rows.
"""
