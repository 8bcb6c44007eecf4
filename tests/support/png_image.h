#pragma once
// stb_image for the tests that read the PNGs Lockstep writes: its implementation, static, in each
// translation unit that includes this header (once, when test files are batched into one).
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb/stb_image.h>
