
paperspapers-1