// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <feedline/version.hpp>
#include <string>

TEST(Version, IsSet) { EXPECT_FALSE(std::string(feedline::version()).empty()); }
