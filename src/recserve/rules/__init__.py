"""Business rules at serving time: which items of the catalogue an answer may hold.

``language``: a filter over the item table's attributes, parsed and checked once, compiled to a mask.
"""
