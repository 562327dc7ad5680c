"""Manipulation: an arm (``tasks/assets/arm.xml``) reaching a pose (``arm_reach``) and lifting a
cube to a goal (``arm_lift``).

The generic parts live in :mod:`legion.tasks.mdp`: the pose and position commands (with the
commanded body's position and orientation errors), command-error rewards, the ``command_reached``
success condition, the ``size_scale`` event. :mod:`.terms` holds what needs a gripper and an
object; task configs name those terms ``"legion.tasks.manipulation.terms:<function>"``.
"""
