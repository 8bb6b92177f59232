"""The K210 back-end's own graph rewrites (hardware limits, KPU layer shapes); the flow
(`tl2k210.k210.flow`) orders them with the generic passes."""
