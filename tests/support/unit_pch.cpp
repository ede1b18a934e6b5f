// The translation unit that builds the unit tests' precompiled header
// (unit_pch.hpp); it has no code of its own.
