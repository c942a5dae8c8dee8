"""Short human run names: ``brave-otter-12`` (the number is per workspace)."""

from __future__ import annotations

import random

ADJECTIVES = (
    "amber agile bold brave bright calm clever cosmic crisp curious daring eager fancy fast fierce "
    "gentle glad golden grand happy hardy humble jolly keen kind lively lucky merry mighty misty "
    "nimble noble patient plucky proud quick quiet rapid sharp shiny silent smart snowy solid spry "
    "steady sunny swift tidy tough vivid warm wise witty zesty"
).split()
ANIMALS = (
    "badger bear beaver bison bobcat camel cheetah cobra condor crane dingo dolphin eagle falcon "
    "ferret finch fox gecko gibbon heron ibex jaguar koala lemur lynx magpie marten mole moose "
    "narwhal newt ocelot orca otter owl panda panther pelican puffin quail rabbit raven seal "
    "shark sloth stork swan tapir tiger toucan turtle walrus wolf yak zebra"
).split()


def run_name(number: int, rng: random.Random | None = None) -> str:
    pick = rng or random
    return f"{pick.choice(ADJECTIVES)}-{pick.choice(ANIMALS)}-{number}"
