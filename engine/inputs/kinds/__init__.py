"""The input kinds, one module each holding its ``KIND``; ``hardrank.inputs.registry`` lists them in detection order."""
