"""Typed configs of every job and the one mechanism that turns them into command lines (`cli`) and checks
them (`checks`). Nothing here imports torch or Ray."""
